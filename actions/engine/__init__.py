"""The engine: claim, send, record, lease expiry, reconciliation, escalation, sweeps, audits.

It is the same for every kind of effect and never names one. What differs between kinds comes
from ``actions.kinds``: the receiver and its contract, the reservation hooks, the answer table,
the ledger and the plain words (docs/architecture.md section 10).
"""
