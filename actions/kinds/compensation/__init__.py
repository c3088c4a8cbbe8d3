"""The compensation kind: recovering money that the receiver paid out twice (docs/architecture.md
section 10).

- ``contract``: the ``CompensationKind`` the registry holds, its receiver (a person in finance:
  no keys, no lookup) and its id.

Its proposal is the ledger audit's correction, started from a duplicate effect by an admin
(``actions.review.corrections.discrepancy_compensate``).
"""
