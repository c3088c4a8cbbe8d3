"""Corrections: what admins change through the admin site (invariant 10: only admins correct).

A correction never edits history. Reassigning an owner writes an audit event beside the status
it leaves as it is. A duplicate effect (the receiver paid one action out twice) is answered by a
new, compensating action in the intent log: its own id, payload, hash and key, PROPOSED, waiting
for a manager's approval like any other proposal. The original action and its trail stay as
they are: they are the record of what happened.

What executing a compensation means (recovering the money from the customer, e.g. by an
invoice) is outside the refund provider's contract. The dispatcher must never send one to the
refund provider, and the compensation's payload names no charge, so that nothing in it could
be sent as a refund. Recovering the money is a manual step for finance.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from actions import permissions as perms
from actions.foundation.refusals import Refused
from actions.foundation.trail import Actor, event_record
from actions.kinds import DuplicateCorrection, kind_for
from actions.kinds.compensation.contract import compensation_action_id
from actions.kinds.fields import ProposalInvalid
from actions.kinds.invoice_adjustment.corrections import discrepancy_void_duplicate
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    FollowUpStatus,
    ReasonCode,
    Remedy,
)
from actions.models.actions import UNRESOLVED_STATUSES
from actions.providers.base import validate_idempotency_key
from actions.review.services import action_owner_record
from actions.services import (
    ProposalConflict,
    payload_differences,
    payload_hash,
    payload_versioned,
    proposal_record,
)

S = ActionStatus

CORRECT_PERMISSION = perms.CORRECT
# The owner of an action is the person who must resolve it, so only someone who may resolve can own it.
RESOLVE_PERMISSION = perms.RESOLVE
MAX_REASON_LENGTH = 2000


class CorrectionRefused(Refused):
    """A correction the rules do not allow (the admin's corrections)."""


def _require_admin(user: Any) -> None:
    if not getattr(user, "is_active", False) or not user.has_perm(CORRECT_PERMISSION):
        raise CorrectionRefused("Only admins may make corrections.", code="not_an_admin", status=403)


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise CorrectionRefused("Say why: the reason goes into the audit trail.", code="reason_required", status=400)
    if len(reason) > MAX_REASON_LENGTH:
        raise CorrectionRefused(
            f"Keep the reason under {MAX_REASON_LENGTH} characters.", code="reason_too_long", status=400
        )
    return reason


# --- reassigning an owner ------------------------------------------------------------------


def owner_candidates() -> QuerySet[User]:
    """The active people who may own an action: those who may resolve it."""
    user_model = get_user_model()
    assert issubclass(user_model, User)
    return user_model.objects.with_perm(
        # Named, because django-axes's backend is also configured and holds no permissions.
        RESOLVE_PERMISSION,
        is_active=True,
        include_superusers=True,
        backend="django.contrib.auth.backends.ModelBackend",
    ).order_by("username")


def action_owner_assign(*, action_pk: int, owner: Any, user: Any, reason: str, now: datetime | None = None) -> Action:
    """Give an action whose effect is unresolved a new named owner, with an audit event that says
    who and why (e.g. when its owner is away and REVIEW_OWNERS_ONLY keeps colleagues out).

    The status does not change: the event's from_state and to_state are both the current status.
    Assigning the owner it already has changes nothing and writes nothing.
    """
    _require_admin(user)
    reason = _require_reason(reason)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update(of=("self",)).select_related("owner").get(pk=action_pk)
        if action.status not in UNRESOLVED_STATUSES:
            raise CorrectionRefused(
                f"{action.action_id} is {action.get_status_display().lower()}: only an action whose effect is "
                "unresolved (submitting, unknown, settling, needs review) has an owner.",
                code="not_open",
            )
        _require_candidate(owner)
        if action.owner_id == owner.pk:
            return action
        action_owner_record(action=action, owner=owner, user=user, reason=reason, now=now)
    return action


def _require_candidate(owner: Any) -> None:
    if owner is None or not owner_candidates().filter(pk=owner.pk).exists():
        raise CorrectionRefused(
            "The owner must be an active person who may resolve actions (the finance role).",
            code="owner_cannot_resolve",
            status=400,
        )


def followup_owner_assign(
    *,
    model: type[Remedy] | type[Discrepancy],
    pk: int,
    owner: Any,
    user: Any,
    reason: str,
    now: datetime | None = None,
) -> Remedy | Discrepancy:
    """Give an open remedy or discrepancy a new owner. The item's note says so, and so does the
    trail of the action it belongs to (an event from its status to itself), in one transaction."""
    _require_admin(user)
    reason = _require_reason(reason)
    now = now or timezone.now()
    name = model._meta.verbose_name
    with transaction.atomic(durable=True):
        item = model.objects.select_for_update(of=("self",)).select_related("owner", "action").get(pk=pk)
        if item.status not in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS):
            raise CorrectionRefused(f"This {name} is closed: there is nothing left to own.", code="not_open")
        _require_candidate(owner)
        if item.owner_id == owner.pk:
            return item
        previous = item.owner.get_username() if item.owner is not None else None
        item.owner = owner
        line = f"[{timezone.localtime(now):%Y-%m-%d %H:%M} {user.get_username()}] assigned to {owner.get_username()}"
        item.note = f"{item.note.rstrip()}\n{line}: {reason}".strip()
        item.save(update_fields=["owner", "note", "updated_at"])
        if item.action is not None:
            event_record(
                action=item.action,
                transition=f"{model._meta.model_name}_assign_owner",
                from_state=item.action.status,
                actor=Actor.for_user(user),
                reason=reason,
                evidence={
                    str(model._meta.model_name): item.pk,
                    "owner": owner.get_username(),
                    "previous_owner": previous,
                },
                now=now,
            )
    return item


# --- compensating a duplicate effect -------------------------------------------------------


def _duplicate_references(discrepancy: Discrepancy, original: Action) -> list[str]:
    # Reconciliation and the audit list the effects found; records from before effect kinds say "refunds".
    found = discrepancy.details.get("effects", discrepancy.details.get("refunds", []))
    refunds = sorted(str(reference) for reference in found)
    if not original.provider_reference:
        raise CorrectionRefused(
            f"{original.action_id} has no recorded refund yet, so which refund is the duplicate is not known. "
            "Resolve the original action first.",
            code="original_unresolved",
        )
    if original.provider_reference not in refunds:
        raise CorrectionRefused(
            f"{original.action_id} recorded {original.provider_reference}, which is not among the refunds found "
            f"({', '.join(refunds) or 'none'}). Explain this discrepancy by hand.",
            code="reference_not_among_refunds",
        )
    duplicates = [reference for reference in refunds if reference != original.provider_reference]
    if not duplicates:
        raise CorrectionRefused("The audit found no second refund for this action.", code="no_duplicate")
    return duplicates


def discrepancy_compensate(*, discrepancy_pk: int, user: Any, note: str, now: datetime | None = None) -> Action:
    """Start a compensating action for a duplicate effect. A second call returns the same action.

    The compensation is proposed by ``user`` (an admin) and waits, PROPOSED, for a manager's
    approval: four eyes apply as to any proposal, and no auto-approval policy applies. The
    discrepancy moves to IN_PROGRESS and names the compensation in
    ``details["compensating_action"]``. The original action is not touched.
    """
    _require_admin(user)
    note = _require_reason(note)
    now = now or timezone.now()
    # An invoice adjustment's duplicate is a second credit note: it is voided at the accounting
    # system, not recovered from a customer. Never start a refund compensation for one.
    kind = Discrepancy.objects.filter(pk=discrepancy_pk).values_list("action__kind", flat=True).first()
    if kind is not None and kind_for(kind).duplicate_correction == DuplicateCorrection.VOID:
        return _void_duplicate_credit_note(discrepancy_pk=discrepancy_pk, user=user, note=note, now=now)
    with transaction.atomic(durable=True):
        # Locked, so two admins starting the same compensation at once get one action.
        discrepancy = Discrepancy.objects.select_for_update().get(pk=discrepancy_pk)
        linked = discrepancy.details.get("compensating_action")
        if linked:
            return Action.objects.get(action_id=linked)
        _refuse_unless_compensable(discrepancy)
        original = Action.objects.select_related("order").get(pk=discrepancy.action_id)
        duplicates = _duplicate_references(discrepancy, original)
        action = _compensation_proposed(
            discrepancy=discrepancy, original=original, duplicates=duplicates, user=user, note=note, now=now
        )
        # The owner stays as it is: finance, not the admin, recovers the money and closes the item.
        discrepancy.status = DiscrepancyStatus.IN_PROGRESS
        discrepancy.details = {**discrepancy.details, "compensating_action": action.action_id}
        line = (
            f"[{timezone.localtime(now):%Y-%m-%d %H:%M} {user.get_username()}] "
            f"compensating action {action.action_id} proposed: {note}"
        )
        discrepancy.note = f"{discrepancy.note.rstrip()}\n{line}".strip()
        discrepancy.save(update_fields=["status", "details", "note", "updated_at"])
    return action


def _refuse_unless_compensable(discrepancy: Discrepancy) -> None:
    """Only an open duplicate effect of a known action is compensated."""
    if discrepancy.kind != DiscrepancyKind.DUPLICATE_EFFECT:
        raise CorrectionRefused(
            f"Only a duplicate effect is compensated; this is {discrepancy.get_kind_display().lower()}.",
            code="not_a_duplicate",
        )
    if discrepancy.status not in (DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS):
        status = discrepancy.get_status_display().lower()
        raise CorrectionRefused(f"This discrepancy is {status} already.", code="closed")
    if discrepancy.action_id is None:
        raise CorrectionRefused("The discrepancy names no action.", code="no_action")


def _compensation_proposed(
    *, discrepancy: Discrepancy, original: Action, duplicates: list[str], user: Any, note: str, now: datetime
) -> Action:
    """The compensation of ``duplicates``, PROPOSED for a manager: the one on record when it exists
    with the same payload, refused when its id names another discrepancy or amount."""
    action_id = compensation_action_id(duplicate_reference=duplicates[0])
    try:
        validate_idempotency_key(action_id)
    except ValueError as error:
        raise CorrectionRefused(f"Cannot name the compensation: {error}.", code="invalid_reference") from error

    # The original payload's amount keeps the currency's own decimals ("500" for JPY).
    amount = Decimal(original.payload.get("amount", original.amount)) * len(duplicates)
    payload = payload_versioned({
        "kind": ActionKind.COMPENSATION.value,
        "compensates": original.action_id,
        "duplicate_refunds": duplicates,
        "discrepancy": discrepancy.pk,
        "order": original.order.number if original.order is not None else None,
        "amount": str(amount),
        "currency": original.currency,
        "reason_code": ReasonCode.DUPLICATE_CHARGE.value,
    })
    digest = payload_hash(payload)

    action = Action.objects.filter(action_id=action_id).first()
    if action is not None and payload_differences(action, payload, digest):
        raise CorrectionRefused(
            f"{action_id} already exists for another discrepancy or amount. Nothing was changed.",
            code="conflict",
        )
    if action is None:
        action = Action(
            action_id=action_id,
            kind=ActionKind.COMPENSATION,
            idempotency_key=action_id,
            payload=payload,
            payload_hash=digest,
            order=original.order,
            amount=amount,
            currency=original.currency,
            reason_code=ReasonCode.DUPLICATE_CHARGE,
            evidence=(
                f"The receiver paid {original.action_id} out {len(duplicates) + 1} times "
                f"(recorded {original.provider_reference}; duplicate {', '.join(duplicates)}). "
                f"This recovers {amount} {original.currency} from the customer, e.g. by an invoice: "
                f"finance records the recovery, nothing is sent to the refund provider. {note}"
            ),
            proposed_by_user=user,
        )
        try:
            action = proposal_record(
                action=action,
                proposer=Actor.for_user(user),
                now=now,
                policy_reasons=[],
                event_evidence={
                    "payload": payload,
                    "payload_hash": digest,
                    "compensates": original.action_id,
                    "discrepancy": discrepancy.pk,
                },
                # Four eyes apply as to any proposal; no auto-approval policy applies.
                auto_policy=False,
                reason=note,
            ).action
        except ProposalConflict as conflict:
            raise CorrectionRefused(
                f"{action_id} was created at the same time for another discrepancy or amount. Nothing was changed.",
                code="conflict",
            ) from conflict
    return action


# --- voiding a duplicate credit note (invoice adjustments) -------------------------------------


def _void_duplicate_credit_note(*, discrepancy_pk: int, user: Any, note: str, now: datetime) -> Action:
    try:
        return discrepancy_void_duplicate(discrepancy_pk=discrepancy_pk, user=user, note=note, now=now)
    except ProposalInvalid as invalid:
        raise CorrectionRefused(
            " ".join(problem.message for problem in invalid.problems), code=invalid.problems[0].code
        ) from invalid


def adjustment_duplicates(action: Action) -> list[Discrepancy]:
    """The ledger audit's open findings of a second credit note for this adjustment."""
    return list(
        Discrepancy.objects.filter(
            action=action,
            kind=DiscrepancyKind.DUPLICATE_EFFECT,
            status__in=[DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS],
        ).order_by("pk")
    )


def adjustment_void_duplicate(*, action_pk: int, user: Any, note: str, now: datetime | None = None) -> Action:
    """The admin's correction for a SUCCEEDED invoice adjustment the accounting system holds twice:
    propose voiding the duplicate credit note that the ledger audit found.

    The credit note the console recorded is the adjustment and is never voided here. The void is a
    new action (``credit-note-void:<credit note id>``), PROPOSED for a manager's approval (four
    eyes, never the policy), then sent by the engine like any action; the adjustment and its trail
    stay as they are. A second call returns the same void.
    """
    _require_admin(user)
    note = _require_reason(note)
    now = now or timezone.now()
    action = Action.objects.get(pk=action_pk)
    if kind_for(action.kind).duplicate_correction != DuplicateCorrection.VOID:
        raise CorrectionRefused(
            f"{action.action_id} is not an invoice adjustment: only a credit note is voided.", code="wrong_kind"
        )
    if action.status != S.SUCCEEDED:
        raise CorrectionRefused(
            f"{action.action_id} is {action.get_status_display().lower()}: only a SUCCEEDED adjustment has a "
            "credit note on record to tell the duplicate from.",
            code="not_succeeded",
        )
    found = adjustment_duplicates(action)
    if not found:
        raise CorrectionRefused(
            f"The ledger audit found no second credit note for {action.action_id}: there is nothing to void. "
            f"{action.provider_reference or 'Its credit note'} is the adjustment itself.",
            code="no_duplicate",
        )
    return _void_duplicate_credit_note(discrepancy_pk=found[0].pk, user=user, note=note, now=now)
