"""The refund kind: money back to a customer through the payment provider (docs/architecture.md
section 10).

- ``contract``: the ``RefundKind`` the registry holds, its receiver (the payment provider), its
  answer table, its reservation hooks on the order and its remedy on a final failure.
- ``explanations``: what changed on an order, in a clerk's words.
- ``checks``: the proposal's checks, each a named step that reads and never writes.
- ``requests``, ``proposal`` (services layer): opening a refund request on an order, and the
  proposal service (``action_propose_refund``).

Nothing is imported here: the contract sits in the kinds layer, below the engine, and the
proposal service above it (pyproject.toml, ``[tool.importlinter]``).
"""
