"""Effect kinds: one package per kind, each registered by name (docs/architecture.md section 10).

Each kind's package (``actions/kinds/<kind>/``) holds its contract (the ``EffectKind`` below),
its proposal checks and proposal service, its explanations and its correction. Importing this
package registers the shipped kinds, one line each. The engine finds a kind only through
``kind_for(name)``.
"""

from __future__ import annotations

from actions.kinds.base import DuplicateCorrection, EffectKind, ReceiverContract, StepClass
from actions.kinds.compensation.contract import CompensationKind
from actions.kinds.customer_email.contract import CustomerEmailKind
from actions.kinds.invoice_adjustment.contract import InvoiceAdjustmentKind
from actions.kinds.invoice_adjustment.void import CreditNoteVoidKind
from actions.kinds.refund.contract import RefundKind
from actions.kinds.registry import all_kinds, kind_for, owner_group_of, owner_groups, register, unregister
from actions.kinds.supplier_email.contract import SupplierEmailKind

register(RefundKind())
register(CompensationKind())
register(SupplierEmailKind())
register(InvoiceAdjustmentKind())
register(CreditNoteVoidKind())
register(CustomerEmailKind())

__all__ = [
    "DuplicateCorrection",
    "EffectKind",
    "ReceiverContract",
    "StepClass",
    "all_kinds",
    "kind_for",
    "owner_group_of",
    "owner_groups",
    "register",
    "unregister",
]
