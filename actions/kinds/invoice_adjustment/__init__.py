"""The invoice-adjustment kind: a supplier credit note against a bill in the accounting system
(docs/architecture.md section 10).

- ``contract``: the ``InvoiceAdjustmentKind`` the registry holds, its receiver (the accounting
  system), its answer table and its reservation hooks on the bill.
- ``void``: its correction, the ``CreditNoteVoidKind`` that voids a duplicate credit note.
- ``explanations``: what changed on a bill, in a clerk's words.
- ``checks``: the proposal's checks, each a named step that reads and never writes.
- ``requests``, ``proposal``, ``corrections`` (services layer): opening an adjustment request,
  the proposal service (``action_propose_invoice_adjustment``), and proposing the void of a
  duplicate the ledger audit found.

Nothing is imported here: the contract sits in the kinds layer, below the engine, and the
services above it (pyproject.toml, ``[tool.importlinter]``).
"""
