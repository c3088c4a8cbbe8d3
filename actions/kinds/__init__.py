"""Effect kinds: one module per kind, each registered by name (docs/architecture.md section 10).

Importing this package registers the shipped kinds. The engine finds a kind only through
``kind_for(name)``.
"""

from __future__ import annotations

from actions.kinds.base import DuplicateCorrection, EffectKind, ReceiverContract, StepClass
from actions.kinds.compensation import CompensationKind
from actions.kinds.customer_email import CustomerEmailKind
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
