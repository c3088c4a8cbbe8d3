"""The supplier-email kind: telling a supplier about a change, by email (docs/architecture.md
section 10).

- ``contract``: the ``SupplierEmailKind`` the registry holds, its receiver (the mail relay, with
  no keys and no lookup), its answer table and its check of the supplier's contacts at the claim.
- ``checks``: the proposal's checks and the template's rendering, each a named step.
- ``proposal``: the proposal service (``supplier_email_propose``), in the services layer.

Nothing is imported here: the contract sits in the kinds layer, below the engine, and the
proposal service above it (pyproject.toml, ``[tool.importlinter]``).
"""
