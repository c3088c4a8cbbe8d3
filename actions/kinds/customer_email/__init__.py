"""The customer-email kind: a notice to an order's customer, sent as a workflow's last step
(docs/architecture.md section 10).

- ``contract``: the ``CustomerEmailKind`` the registry holds; it shares the supplier email's
  receiver (the mail relay) and checks the customer's address at the claim.

Only a workflow proposes one (``actions.workflows.templates.refund_with_notice``), from a fixed
template: it has no proposal service of its own.
"""
