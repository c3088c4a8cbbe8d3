"""The invoice adjustment's plain explanations: what changed on a bill, in a clerk's words.

A manager's decision made on an older page is refused with these sentences
(``InvoiceAdjustmentKind.target_changed_words``).
"""

from __future__ import annotations

from actions.foundation.trail import trail_events
from actions.models import Bill


def bill_changes_since(bill: Bill, version: int) -> list[str]:
    """What raised ``bill``'s version past ``version``, in a clerk's words: each adjustment
    reserved on it (its reservation's event records the version it found, and raised it by
    one), and whatever else changed the bill."""
    reserved = trail_events(
        action__bill_id=bill.pk,
        transition="begin_submission",
        evidence__order_version__gte=version,
        select_related=("action",),
    )
    changes = [f"another adjustment of {event.action.amount} {event.action.currency} went ahead" for event in reserved]
    if bill.voided:
        changes.append("it was voided")
    elif bill.version - version > len(reserved):
        changes.append("its details were changed")
    return changes
