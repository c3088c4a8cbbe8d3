"""Finance's changes: owners, live lookups, resolutions of actions that need review, and the
follow-up workflow of remedies and discrepancies.

Every function checks permission itself (a view's check is a courtesy, this one is the rule),
refuses bad input before writing anything, and makes its change and its audit record in one
transaction. A call to the provider never runs inside a transaction: a resolution first asks
the provider (outside), then records the answer and the change in one short transaction, and
refuses when the provider's live answer contradicts the person (DESIGN.md section 7: only the
receiver's record proves an effect).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django_fsm import has_transition_perm

from actions.execution import (
    order_book_success,
    order_release,
    provider_from_settings,
    submission_request_body,
    submission_send_and_record,
)
from actions.models import (
    Action,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyStatus,
    FollowUpStatus,
    Remedy,
    RemedyKind,
)
from actions.providers.base import NotFoundError, Provider, ProviderRefund, RefundStatus
from actions.providers.money import currency_exponent, to_minor_units
from actions.reconciliation import Lookup, LookupVerdict, provider_lookup
from actions.review_selectors import RESOLVE_PERMISSION, owner_rule_refusal
from actions.services import AMOUNT_PATTERN, Actor, action_transition, event_record

S = ActionStatus

MAX_REASON_LENGTH = 1000
REFERENCE_PATTERN = re.compile(r"^[A-Za-z0-9_\-]{1,255}$")
EFFECT_STATUSES = frozenset({RefundStatus.SUCCEEDED, RefundStatus.PENDING, RefundStatus.REQUIRES_ACTION})
REMEDY_PERMISSION = "actions.change_remedy"
DISCREPANCY_PERMISSION = "actions.change_discrepancy"
# The remedies a person may choose when a refund failed for good.
REMEDY_CHOICES = (RemedyKind.STORE_CREDIT, RemedyKind.MANUAL_TRANSFER, RemedyKind.CHEQUE, RemedyKind.NONE)


class ReviewRefused(Exception):
    """A change the rules do not allow. Nothing was changed; the message says why, for a person.

    ``status`` is the HTTP status a view answers with: 400 bad input (``field`` names it), 403 a
    rule about who may act, 404 no such thing, 409 the state or the provider's answer does not
    allow it now.
    """

    def __init__(self, message: str, *, code: str, status: int = 409, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.field = field


@dataclass(frozen=True)
class LookupResult:
    action: Action
    attempt: Attempt
    lookup: Lookup


@dataclass(frozen=True)
class Resolution:
    """What a resolution did, and what the provider said when it was checked."""

    action: Action
    message: str
    check: Attempt | None = None
    remedy: Remedy | None = None
    outcome: str = ""


# --- input --------------------------------------------------------------------------------------


def _text(raw: object, *, name: str, required: bool, label: str) -> str:
    value = str(raw or "").strip()
    if "\x00" in value:
        raise ReviewRefused(f"{name}: the text contains a NUL character.", code="invalid", status=400, field=name)
    if len(value) > MAX_REASON_LENGTH:
        raise ReviewRefused(
            f"{name}: keep it under {MAX_REASON_LENGTH} characters.", code="too_long", status=400, field=name
        )
    if required and not value:
        raise ReviewRefused(f"{name}: {label}", code="required", status=400, field=name)
    return value


def _reason(raw: object) -> str:
    return _text(raw, name="reason", required=True, label="Give a reason for the audit trail.")


def _reference(raw: object) -> str:
    value = str(raw or "").strip()
    if not value:
        raise ReviewRefused(
            "provider_reference: give the provider's refund reference (for example re_...).",
            code="required",
            status=400,
            field="provider_reference",
        )
    if not REFERENCE_PATTERN.match(value):
        raise ReviewRefused(
            "provider_reference: use the provider's id as it shows it: letters, digits, '_' or '-'.",
            code="invalid",
            status=400,
            field="provider_reference",
        )
    return value


def _remedy_kind(raw: object, *, allow_undecided: bool = False) -> str:
    value = str(raw or "")
    allowed = [choice.value for choice in REMEDY_CHOICES]
    if allow_undecided:
        allowed.append(RemedyKind.UNDECIDED.value)
    if value not in allowed:
        names = ", ".join(str(RemedyKind(choice).label).lower() for choice in allowed)
        raise ReviewRefused(f"remedy_kind: choose one of {names}.", code="invalid", status=400, field="remedy_kind")
    return value


def _expected_amount(raw: object, action: Action) -> Decimal:
    text = str(raw if raw is not None else "").strip()
    if not text:
        return action.amount
    problem = f"expected_amount: give an amount like {action.amount} ({action.currency}), at most the refund's amount."
    if not AMOUNT_PATTERN.match(text):
        raise ReviewRefused(problem, code="invalid", status=400, field="expected_amount")
    try:
        amount = Decimal(text)
    except InvalidOperation as error:
        raise ReviewRefused(problem, code="invalid", status=400, field="expected_amount") from error
    exponent = currency_exponent(action.currency)
    if amount <= 0 or amount > action.amount or -amount.normalize().as_tuple().exponent > exponent:  # type: ignore[operator]
        raise ReviewRefused(problem, code="invalid", status=400, field="expected_amount")
    return amount.quantize(Decimal(1).scaleb(-exponent))


# --- who may act ---------------------------------------------------------------------------------


def _require(user: Any, permission: str, message: str) -> None:
    if not getattr(user, "is_authenticated", False) or not user.has_perm(permission):
        raise ReviewRefused(message, code="not_allowed", status=403)


def _owner_rule(user: Any, owner: Any) -> None:
    refusal = owner_rule_refusal(user=user, owner=owner)
    if refusal is not None:
        raise ReviewRefused(refusal, code="not_owner", status=403)


def _action(action_pk: int, *, lock: bool = False) -> Action:
    queryset = Action.objects.select_for_update(of=("self",)) if lock else Action.objects
    try:
        return queryset.select_related("owner").get(pk=action_pk)
    except Action.DoesNotExist as missing:
        raise ReviewRefused("There is no such action.", code="not_found", status=404) from missing


def _new_owner(owner_pk: object, *, permission: str) -> Any:
    """The finance member an item is (re)assigned to, checked: active and allowed to work it."""
    try:
        pk = int(str(owner_pk))
    except (TypeError, ValueError):
        raise ReviewRefused("owner: choose a member of finance.", code="invalid", status=400, field="owner") from None
    owner = get_user_model().objects.filter(pk=pk, is_active=True).first()
    if owner is None or not owner.has_perm(permission):
        raise ReviewRefused(
            "owner: that person is not an active member of finance.", code="invalid", status=400, field="owner"
        )
    return owner


def _stamp(now: datetime, user: Any, what: str, note: str) -> str:
    line = f"[{timezone.localtime(now):%Y-%m-%d %H:%M} {user.get_username()}] {what}"
    return f"{line}: {note}" if note else line


# --- owners --------------------------------------------------------------------------------------


def action_assign(*, action_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Action:
    """Make ``owner_pk`` (default: ``user``) the action's named owner. The status does not change,
    so the audit event runs from the status to itself (the trail stays a valid chain)."""
    _require(user, RESOLVE_PERMISSION, "Only finance may take or reassign actions in the review queue.")
    note = _text(note, name="note", required=False, label="")
    owner = user if owner_pk in (None, "") else _new_owner(owner_pk, permission=RESOLVE_PERMISSION)
    now = timezone.now()
    with transaction.atomic(durable=True):
        action = _action(action_pk, lock=True)
        if action.status not in (S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW):
            raise ReviewRefused(
                f"{action.action_id} is {action.get_status_display().lower()}: there is nothing left to own.",
                code="not_open",
            )
        _owner_rule(user, action.owner)
        previous = action.owner
        if previous is not None and previous.pk == owner.pk:
            raise ReviewRefused(f"{action.action_id} already belongs to {owner.get_username()}.", code="unchanged")
        action.owner = owner
        action.save(update_fields=["owner", "updated_at"])
        event_record(
            action=action,
            transition="assign_owner",
            from_state=action.status,
            actor=Actor.for_user(user),
            reason=note or f"Assigned to {owner.get_username()} by {user.get_username()}.",
            evidence={
                "owner": owner.get_username(),
                "previous_owner": previous.get_username() if previous else None,
            },
            now=now,
        )
    return action


def _follow_up_assign(
    *, model: type[Remedy] | type[Discrepancy], pk: int, user: Any, owner_pk: object, note: str, permission: str
) -> Any:
    name = model._meta.verbose_name
    _require(user, permission, f"Only finance may take or reassign a {name}.")
    note = _text(note, name="note", required=False, label="")
    owner = user if owner_pk in (None, "") else _new_owner(owner_pk, permission=permission)
    now = timezone.now()
    with transaction.atomic(durable=True):
        item = model.objects.select_for_update(of=("self",)).select_related("owner", "action").filter(pk=pk).first()
        if item is None:
            raise ReviewRefused(f"There is no such {name}.", code="not_found", status=404)
        if item.status not in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS):
            raise ReviewRefused(f"This {name} is closed: there is nothing left to own.", code="not_open")
        _owner_rule(user, item.owner)
        previous = item.owner
        if previous is not None and previous.pk == owner.pk:
            raise ReviewRefused(f"This {name} already belongs to {owner.get_username()}.", code="unchanged")
        item.owner = owner
        item.note = _join(item.note, _stamp(now, user, f"assigned to {owner.get_username()}", note))
        item.save(update_fields=["owner", "note", "updated_at"])
        _follow_up_event(item, transition=f"{model._meta.model_name}_assign_owner", user=user, note=note, now=now)
    return item


def remedy_assign(*, remedy_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Remedy:
    item: Remedy = _follow_up_assign(
        model=Remedy, pk=remedy_pk, user=user, owner_pk=owner_pk, note=note, permission=REMEDY_PERMISSION
    )
    return item


def discrepancy_assign(*, discrepancy_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Discrepancy:
    item: Discrepancy = _follow_up_assign(
        model=Discrepancy,
        pk=discrepancy_pk,
        user=user,
        owner_pk=owner_pk,
        note=note,
        permission=DISCREPANCY_PERMISSION,
    )
    return item


def _join(existing: str, line: str) -> str:
    return f"{existing.rstrip()}\n{line}" if existing.strip() else line


def _follow_up_event(item: Remedy | Discrepancy, *, transition: str, user: Any, note: str, now: datetime) -> None:
    """A follow-up tied to an action also shows in that action's trail (the status is unchanged)."""
    action = item.action
    if action is None:
        return
    event_record(
        action=action,
        transition=transition,
        from_state=action.status,
        actor=Actor.for_user(user),
        reason=note or f"{item} by {user.get_username()}.",
        evidence={
            str(type(item)._meta.model_name): item.pk,
            "status": item.status,
            "owner": item.owner.get_username() if item.owner else None,
        },
        now=now,
    )


# --- the live lookup -----------------------------------------------------------------------------


def _ask_provider(action: Action, provider: Provider) -> Lookup | None:
    """Ask the provider about the action. Outside any transaction; None if it offers no lookup."""
    if not provider.guarantees.supports_lookup:
        return None
    return provider_lookup(action=action, provider=provider)


def _record_lookup(
    *, action: Action, lookup: Lookup | None, user: Any, purpose: str, started_at: datetime, now: datetime
) -> Attempt:
    """The lookup as an attempt row: every call to the receiver is on record. Call inside a transaction."""
    return Attempt.objects.create(
        action=action,
        kind=AttemptKind.LOOKUP,
        idempotency_key=action.idempotency_key,
        request={
            "charge": action.payload.get("charge", ""),
            "action_id": action.action_id,
            "refund_id": action.provider_reference,
            "for_status": action.status,
            "requested_by": user.get_username(),
            "purpose": purpose,
        },
        response=lookup.response_json() if lookup is not None else None,
        error=lookup.error_json()
        if lookup is not None
        else {"type": "NoLookup", "code": None, "message": "The provider offers no lookup."},
        outcome=lookup.verdict if lookup is not None else "no_lookup",
        started_at=started_at,
        finished_at=now,
    )


def action_lookup(*, action_pk: int, user: Any, provider: Provider | None = None) -> LookupResult:
    """Ask the provider now what it has for the action, and keep the answer as a lookup attempt.

    The call runs outside any transaction; the record is one short transaction after it.
    """
    _require(user, RESOLVE_PERMISSION, "Only finance may look actions up at the provider.")
    action = _action(action_pk)
    _owner_rule(user, action.owner)
    if action.attempt_count == 0:
        raise ReviewRefused(
            f"{action.action_id} has never been sent to the provider: there is nothing to look up.",
            code="never_sent",
        )
    provider = provider or provider_from_settings()
    started_at = timezone.now()
    lookup = _ask_provider(action, provider)
    if lookup is None:
        raise ReviewRefused("The provider offers no lookup: only its own records can tell.", code="no_lookup")
    with transaction.atomic(durable=True):
        attempt = _record_lookup(
            action=action, lookup=lookup, user=user, purpose="lookup", started_at=started_at, now=timezone.now()
        )
    return LookupResult(action=action, attempt=attempt, lookup=lookup)


# --- resolutions of NEEDS_REVIEW ------------------------------------------------------------------


def _check_resolvable(action: Action, user: Any, transition: str) -> None:
    if action.status != S.NEEDS_REVIEW:
        raise ReviewRefused(
            f"{action.action_id} is {action.get_status_display().lower()} now, not waiting for review. "
            "Reload the page to see what happened.",
            code="not_needs_review",
        )
    if not has_transition_perm(getattr(action, transition), user):
        raise ReviewRefused("Only finance may resolve an action that needs review.", code="not_allowed", status=403)
    _owner_rule(user, action.owner)


def _prepare(action_pk: int, user: Any, transition: str) -> Action:
    """The action, if ``user`` may resolve it now: read without a lock, checked again under one."""
    action = _action(action_pk)
    _check_resolvable(action, user, transition)
    return action


def _effects(lookup: Lookup) -> list[ProviderRefund]:
    return [refund for refund in lookup.refunds if refund.status in EFFECT_STATUSES]


def _refunds_text(refunds: list[ProviderRefund]) -> str:
    return ", ".join(f"{refund.id} ({refund.status})" for refund in refunds)


def _conflict_succeeded(action: Action, lookup: Lookup | None, reference: str) -> str | None:
    if lookup is None:
        return None
    if lookup.verdict == LookupVerdict.INCONCLUSIVE:
        return (
            f"The provider could not confirm it ({lookup.error}). Nothing is recorded as succeeded without its answer."
        )
    if lookup.verdict == LookupVerdict.NOT_FOUND:
        return "The provider has no refund for this action, so it cannot be confirmed as succeeded."
    if lookup.verdict == LookupVerdict.DUPLICATE:
        # Confirming the one named refund books the amount once; the other effect stays on record
        # as a discrepancy (reconciliation stored it), to be corrected by a compensating action.
        named = [r for r in lookup.refunds if r.id == reference]
        if not named:
            return (
                f"The provider has {len(lookup.refunds)} refunds for this action ({_refunds_text(lookup.refunds)}). "
                "Name the one to record as this action's effect; the other stays open as a discrepancy."
            )
        refund = named[0]
    else:
        refund = lookup.refunds[0]
    if refund.id != reference:
        return f"The provider's refund for this action is {refund.id}, not {reference}."
    if refund.status != RefundStatus.SUCCEEDED:
        return f"The provider's refund {refund.id} is {refund.status}, not succeeded."
    expected = to_minor_units(action.amount, action.currency)
    if refund.amount_minor != expected or refund.currency.upper() != action.currency:
        return (
            f"The provider's refund {refund.id} is for {refund.amount_minor} {refund.currency.upper()} (minor units), "
            f"not {expected} {action.currency}."
        )
    return None


def _conflict_not_executed(lookup: Lookup | None, *, retry: bool) -> str | None:
    if lookup is None:
        if retry:
            return "The provider offers no lookup, so nothing can prove that a retry would not pay twice."
        return None
    effects = _effects(lookup)
    if effects:
        what = "retried" if retry else "recorded as failed"
        return (
            f"The provider shows {_refunds_text(effects)} for this action: the refund exists, so it cannot be {what}. "
            "Confirm it as succeeded, or wait for it to settle."
        )
    if lookup.verdict == LookupVerdict.INCONCLUSIVE:
        if not retry and isinstance(lookup.error, NotFoundError):
            return None  # the provider has no such charge: no refund can exist on it
        return f"The provider could not be asked ({lookup.error}). Try again in a moment."
    if retry and lookup.verdict != LookupVerdict.NOT_FOUND:
        return f"The provider has refunds for this action ({_refunds_text(lookup.refunds)}): a retry is not safe."
    return None


def _retry_timing(action: Action, provider: Provider, now: datetime) -> str | None:
    guarantees = provider.guarantees
    if not guarantees.lookup_authoritative:
        return "The provider's lookups are not authoritative: a not-found answer does not prove a retry is safe."
    visible_after = (action.last_attempt_at or action.first_attempt_at or now) + guarantees.lookup_visibility_delay
    if now < visible_after:
        return f"The provider's lookup may still be catching up until {visible_after:%H:%M:%S}. Try again then."
    return None


def _failed_timing(action: Action, provider: Provider, now: datetime) -> str | None:
    """A not-found proves "failed" only once no earlier attempt can still arrive at the provider.

    Recording failed releases the reservation and opens a remedy (the customer is paid another
    way): if the refund then appeared at the provider, the customer would be paid twice.
    """
    timing = _retry_timing(action, provider, now)
    if timing is not None:
        return timing
    last = action.last_attempt_at or action.first_attempt_at
    if last is None:
        return None
    quiet_after = last + timedelta(seconds=settings.LEASE_SECONDS) + provider.guarantees.lookup_visibility_delay
    if now < quiet_after:
        return (
            f"The last attempt ({last:%H:%M:%S}) could still reach the provider until {quiet_after:%H:%M:%S}: "
            "record it as failed after that, once a lookup still finds nothing."
        )
    return None


def action_resolve_succeeded(
    *, action_pk: int, user: Any, provider_reference: object, reason: object, provider: Provider | None = None
) -> Resolution:
    """NEEDS_REVIEW -> SUCCEEDED: the provider confirms the refund under ``provider_reference``.

    The order's reserved amount becomes refunded money in the same transaction, as when the
    worker records a success (invariant 5).
    """
    _require(user, RESOLVE_PERMISSION, "Only finance may resolve an action that needs review.")
    reference = _reference(provider_reference)
    reason_text = _reason(reason)
    action = _prepare(action_pk, user, "resolve_succeeded")
    provider = provider or provider_from_settings()
    started_at = timezone.now()
    lookup = _ask_provider(action, provider)
    refusal = None
    with transaction.atomic(durable=True):
        now = timezone.now()
        action = _action(action_pk, lock=True)
        check = _record_lookup(
            action=action,
            lookup=lookup,
            user=user,
            purpose="check before resolving as succeeded",
            started_at=started_at,
            now=now,
        )
        try:
            _check_resolvable(action, user, "resolve_succeeded")
        except ReviewRefused as refused:
            refusal = refused
        else:
            conflict = _conflict_succeeded(action, lookup, reference)
            if conflict is not None:
                refusal = ReviewRefused(conflict, code="provider_disagrees")
            else:
                action_transition(
                    action=action,
                    transition="resolve_succeeded",
                    actor=Actor.for_user(user),
                    reason=reason_text,
                    evidence={
                        "resolution": "succeeded",
                        "provider_reference": reference,
                        "check_attempt_id": check.pk,
                        "provider_answer": check.outcome,
                    },
                    now=now,
                    provider_reference=reference,
                )
                order_book_success(action)
    # The lookup is kept even when the resolution is refused: it is what the provider said.
    if refusal is not None:
        raise refusal
    return Resolution(
        action=action,
        check=check,
        outcome=action.status,
        message=f"{action.action_id} is recorded as succeeded with the provider's refund {reference}; "
        f"{action.amount} {action.currency} moved from reserved to refunded on order {action.payload.get('order')}.",
    )


def action_resolve_failed(
    *,
    action_pk: int,
    user: Any,
    reason: object,
    remedy_kind: object,
    expected_amount: object = None,
    provider: Provider | None = None,
) -> Resolution:
    """NEEDS_REVIEW -> FAILED_FINAL: the provider has no refund, and none will come.

    The reservation is released and a remedy opens with the chosen kind and what the customer
    still expects back, owned by the person who resolved it.
    """
    _require(user, RESOLVE_PERMISSION, "Only finance may resolve an action that needs review.")
    reason_text = _reason(reason)
    kind = _remedy_kind(remedy_kind)
    action = _prepare(action_pk, user, "resolve_failed")
    amount = _expected_amount(expected_amount, action)
    provider = provider or provider_from_settings()
    started_at = timezone.now()
    lookup = _ask_provider(action, provider)
    refusal = None
    remedy = None
    with transaction.atomic(durable=True):
        now = timezone.now()
        action = _action(action_pk, lock=True)
        check = _record_lookup(
            action=action,
            lookup=lookup,
            user=user,
            purpose="check before resolving as failed",
            started_at=started_at,
            now=now,
        )
        try:
            _check_resolvable(action, user, "resolve_failed")
        except ReviewRefused as refused:
            refusal = refused
        else:
            conflict = _conflict_not_executed(lookup, retry=False)
            if conflict is None and lookup is not None and lookup.verdict == LookupVerdict.NOT_FOUND:
                conflict = _failed_timing(action, provider, now)
            if conflict is not None:
                refusal = ReviewRefused(conflict, code="provider_disagrees")
            else:
                action_transition(
                    action=action,
                    transition="resolve_failed",
                    actor=Actor.for_user(user),
                    reason=reason_text,
                    evidence={
                        "resolution": "failed_final",
                        "remedy_kind": kind,
                        "expected_amount": str(amount),
                        "check_attempt_id": check.pk,
                        "provider_answer": check.outcome,
                    },
                    now=now,
                )
                order_release(action)
                remedy = Remedy.objects.create(
                    action=action,
                    kind=kind,
                    amount=amount,
                    currency=action.currency,
                    owner=user,
                    note=_stamp(now, user, f"opened as {RemedyKind(kind).label.lower()}", reason_text),
                )
    if refusal is not None:
        raise refusal
    assert remedy is not None
    return Resolution(
        action=action,
        check=check,
        remedy=remedy,
        outcome=action.status,
        message=f"{action.action_id} is recorded as failed for good; the reservation is released and a remedy "
        f"({remedy.get_kind_display().lower()}, {amount} {action.currency}) is open for {user.get_username()}.",
    )


def action_resolve_retry(*, action_pk: int, user: Any, reason: object, provider: Provider | None = None) -> Resolution:
    """NEEDS_REVIEW -> SUBMITTING with the same key and a new lease, then send once more.

    Allowed only when a lookup from the last few minutes (REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS)
    said not found and the provider still says so now (invariant 7: no retry without evidence).
    The send happens after the commit, outside any transaction, by the lease holder (invariant 3).
    """
    # Imported here: the selectors build the page from the same rule.
    from actions.review_selectors import lookup_view, retry_evidence

    _require(user, RESOLVE_PERMISSION, "Only finance may resolve an action that needs review.")
    reason_text = _reason(reason)
    action = _prepare(action_pk, user, "resolve_retry")
    latest = (
        Attempt.objects.filter(action_id=action.pk, kind=AttemptKind.LOOKUP, finished_at__isnull=False)
        .order_by("-finished_at", "-pk")
        .first()
    )
    allowed, why = retry_evidence(lookup_view(latest, now=timezone.now()))
    if not allowed:
        raise ReviewRefused(why, code="no_recent_not_found")
    provider = provider or provider_from_settings()
    started_at = timezone.now()
    lookup = _ask_provider(action, provider)
    refusal = None
    attempt: Attempt | None = None
    lease_token: uuid.UUID | None = None
    with transaction.atomic(durable=True):
        now = timezone.now()
        action = _action(action_pk, lock=True)
        check = _record_lookup(
            action=action, lookup=lookup, user=user, purpose="check before retrying", started_at=started_at, now=now
        )
        try:
            _check_resolvable(action, user, "resolve_retry")
        except ReviewRefused as refused:
            refusal = refused
        else:
            conflict = _conflict_not_executed(lookup, retry=True) or _retry_timing(action, provider, now)
            if conflict is not None:
                refusal = ReviewRefused(conflict, code="provider_disagrees")
            else:
                lease_token = uuid.uuid4()
                action_transition(
                    action=action,
                    transition="resolve_retry",
                    actor=Actor.for_user(user),
                    reason=reason_text,
                    evidence={
                        "resolution": "retry",
                        "idempotency_key": action.idempotency_key,
                        "evidence_attempt_id": latest.pk if latest else None,
                        "check_attempt_id": check.pk,
                        "provider_answer": check.outcome,
                    },
                    now=now,
                    lease_token=lease_token,
                    lease_expires_at=now + timedelta(seconds=settings.LEASE_SECONDS),
                    started_at=now,
                )
                attempt = Attempt.objects.create(
                    action=action,
                    kind=AttemptKind.SUBMIT,
                    lease_token=lease_token,
                    idempotency_key=action.idempotency_key,
                    request=submission_request_body(action),
                    started_at=now,
                )
    if refusal is not None:
        raise refusal
    assert attempt is not None and lease_token is not None
    # Committed: the SUBMITTING row and its attempt exist before the provider hears of it.
    outcome = submission_send_and_record(action=action, attempt=attempt, lease_token=lease_token, provider=provider)
    action.refresh_from_db()
    return Resolution(
        action=action,
        check=check,
        outcome=outcome,
        message=f"{action.action_id} was sent again with the same key {action.idempotency_key}. "
        f"It is {action.get_status_display().lower()} now.",
    )


def action_escalate_to_user(*, action_pk: int, user: Any, reason: object = "") -> Action:
    """UNKNOWN -> NEEDS_REVIEW now, owned by ``user``, instead of waiting for the escalation policy.

    Reconciliation stops polling; a reconciler that is mid-lookup loses its lease and records
    only its attempt.
    """
    _require(user, RESOLVE_PERMISSION, "Only finance may take an action over for review.")
    note = _text(reason, name="reason", required=False, label="")
    now = timezone.now()
    with transaction.atomic(durable=True):
        action = _action(action_pk, lock=True)
        if action.status != S.UNKNOWN:
            raise ReviewRefused(
                f"{action.action_id} is {action.get_status_display().lower()}, not unknown: only an unknown action "
                "can be taken over before the escalation policy hands it on.",
                code="not_unknown",
            )
        _owner_rule(user, action.owner)
        due_at = now + timedelta(hours=settings.REVIEW_DUE_HOURS)
        action_transition(
            action=action,
            transition="escalate",
            actor=Actor.for_user(user),
            reason=f"Taken over by {user.get_username()} from the review queue"
            + (f": {note}" if note else " before the escalation policy's limit."),
            evidence={"owner": user.get_username(), "due_at": due_at.isoformat(), "source": "review queue"},
            now=now,
            owner=user,
            due_at=due_at,
        )
    return action


# --- follow-ups: open -> in progress -> done (remedies) / explained | corrected (discrepancies) ----

REMEDY_FLOW = {FollowUpStatus.OPEN: {FollowUpStatus.IN_PROGRESS}, FollowUpStatus.IN_PROGRESS: {FollowUpStatus.DONE}}
DISCREPANCY_FLOW = {
    DiscrepancyStatus.OPEN: {DiscrepancyStatus.IN_PROGRESS},
    DiscrepancyStatus.IN_PROGRESS: {DiscrepancyStatus.EXPLAINED, DiscrepancyStatus.CORRECTED},
}


def _advance(
    *,
    model: type[Remedy] | type[Discrepancy],
    pk: int,
    user: Any,
    to_status: object,
    note: object,
    flow: dict[Any, set[Any]],
    permission: str,
    remedy_kind: object = None,
) -> Any:
    name = model._meta.verbose_name
    _require(user, permission, f"Only finance may work on a {name}.")
    target = str(to_status or "")
    statuses: type[FollowUpStatus] | type[DiscrepancyStatus] = FollowUpStatus if model is Remedy else DiscrepancyStatus
    choices = {status.value: status for status in statuses}
    if target not in choices:
        raise ReviewRefused(
            f"status: {target[:40]!r} is not a {name} status.", code="invalid", status=400, field="status"
        )
    finishing = target not in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS)
    text = _text(note, name="note", required=finishing, label=f"say what was done before closing the {name}.")
    kind = _remedy_kind(remedy_kind, allow_undecided=True) if remedy_kind not in (None, "") else None
    now = timezone.now()
    with transaction.atomic(durable=True):
        item = model.objects.select_for_update(of=("self",)).select_related("owner", "action").filter(pk=pk).first()
        if item is None:
            raise ReviewRefused(f"There is no such {name}.", code="not_found", status=404)
        _owner_rule(user, item.owner)
        if target not in {status.value for status in flow.get(item.status, set())}:
            raise ReviewRefused(
                f"This {name} is {item.get_status_display().lower()}: it cannot move to "
                f"{choices[target].label.lower()} from there.",
                code="not_allowed_now",
            )
        fields = ["status", "note", "updated_at"]
        if isinstance(item, Remedy):
            if kind is not None:
                item.kind = kind
                fields.append("kind")
            if finishing and item.kind == RemedyKind.UNDECIDED:
                raise ReviewRefused(
                    "remedy_kind: choose how the customer gets the money (or none, with a reason) before closing.",
                    code="required",
                    status=400,
                    field="remedy_kind",
                )
        previous = item.get_status_display().lower()
        item.status = target
        if item.owner is None:
            # Whoever starts or closes an unowned item is its owner from now on.
            item.owner = user
            fields.append("owner")
        item.note = _join(item.note, _stamp(now, user, f"{previous} -> {item.get_status_display().lower()}", text))
        item.save(update_fields=fields)
        _follow_up_event(item, transition=f"{model._meta.model_name}_{target}", user=user, note=text, now=now)
    return item


def remedy_advance(
    *, remedy_pk: int, user: Any, to_status: object, note: object = "", remedy_kind: object = None
) -> Remedy:
    """Move a remedy on: open -> in progress -> done. Closing needs a note and a decided kind."""
    item: Remedy = _advance(
        model=Remedy,
        pk=remedy_pk,
        user=user,
        to_status=to_status,
        note=note,
        flow=REMEDY_FLOW,  # type: ignore[arg-type]
        permission=REMEDY_PERMISSION,
        remedy_kind=remedy_kind,
    )
    return item


def discrepancy_advance(*, discrepancy_pk: int, user: Any, to_status: object, note: object = "") -> Discrepancy:
    """Move a discrepancy on: open -> in progress -> explained or corrected. Closing needs a note."""
    item: Discrepancy = _advance(
        model=Discrepancy,
        pk=discrepancy_pk,
        user=user,
        to_status=to_status,
        note=note,
        flow=DISCREPANCY_FLOW,  # type: ignore[arg-type]
        permission=DISCREPANCY_PERMISSION,
    )
    return item
