"""What a person's resolution of an action must pass before anything is written: the input's
checks, who may act on which kind, and what the receiver's live answer allows (a resolution
that the receiver's record contradicts is refused)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.utils import timezone

from actions import permissions as perms
from actions.foundation.refusals import Refused
from actions.foundation.separation import is_console_admin
from actions.kinds import kind_for, owner_group_of
from actions.kinds.base import Effect, Lookup, LookupVerdict, Outcome, ReceiverContract
from actions.models import Action, ActionStatus
from actions.providers.money import currency_exponent
from actions.review.rules import owner_rule_refusal

S = ActionStatus

MAX_REASON_LENGTH = 1000
REFERENCE_PATTERN = re.compile(r"^[A-Za-z0-9_\-]{1,255}$")
AMOUNT_PATTERN = re.compile(r"^[+-]?[0-9]+(\.[0-9]+)?$")


class ReviewRefused(Refused):
    """A review change the rules do not allow (finance's lookups and resolutions)."""


# --- input --------------------------------------------------------------------------------------


def review_text(raw: object, *, name: str, required: bool, label: str) -> str:
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


def checked_reason(raw: object) -> str:
    return review_text(raw, name="reason", required=True, label="Give a reason for the audit trail.")


def checked_reference(raw: object, noun: str) -> str:
    value = str(raw or "").strip()
    if not value:
        raise ReviewRefused(
            f"provider_reference: give the receiver's reference for the {noun} (for example re_...).",
            code="required",
            status=400,
            field="provider_reference",
        )
    if not REFERENCE_PATTERN.match(value):
        raise ReviewRefused(
            "provider_reference: use the receiver's id as it shows it: letters, digits, '_' or '-'.",
            code="invalid",
            status=400,
            field="provider_reference",
        )
    return value


def checked_failure_choice(raw: object, action: Action) -> str:
    choices = kind_for(action.kind).failure_choices
    value = str(raw or "")
    if not choices:
        return value
    if value not in [choice for choice, _ in choices]:
        names = ", ".join(label.lower() for _, label in choices)
        raise ReviewRefused(f"remedy_kind: choose one of {names}.", code="invalid", status=400, field="remedy_kind")
    return value


def checked_expected_amount(raw: object, action: Action) -> Decimal:
    text = str(raw if raw is not None else "").strip()
    if not text:
        return action.amount
    problem = f"expected_amount: give an amount like {action.amount} ({action.currency}), at most the action's amount."
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


def review_require(user: Any, permission: str, message: str) -> None:
    if not getattr(user, "is_authenticated", False) or not user.has_perm(permission):
        raise ReviewRefused(message, code="not_allowed", status=403)


def resolver_refusal(
    *,
    user: Any,
    kind: str | None,
    owner: Any,
    permission: str = perms.RESOLVE,
    groups: Mapping[str, str] | None = None,
) -> str | None:
    """Why ``user`` may not work on a review item of ``kind`` owned by ``owner`` (resolve it,
    look it up, take it over, pass it on), or None. The one rule: the pages ask it which buttons
    to show and whom to offer for reassignment, the services ask it before they change anything.

    An admin never does, whatever permission or superuser flag he holds (separation of duties).
    Anyone else needs the role's ``permission``, and either to be a member of the kind's owner
    group (``owner_group_of``, the group the five-checks page names) or to be the item's named
    owner: someone an admin gave it to explicitly. An item with no kind (a discrepancy the audit
    found with no action) needs the permission alone. ``groups`` is ``owner_groups()``, read once
    by a page that asks about many items.
    """
    if not getattr(user, "is_authenticated", False):
        return "Sign in to work on review items."
    if is_console_admin(user):
        return (
            "Admins do not resolve review items: the owner group of its kind does (separation of duties). "
            "An admin may reassign it in the admin site."
        )
    if not user.has_perm(permission):
        return "Your role does not work on review items."
    if kind is None or (owner is not None and owner.pk == user.pk):
        return None
    group = groups[kind] if groups is not None else owner_group_of(kind)
    # ``all()``, not a filter: it reads the groups a list of people was fetched with.
    if any(membership.name == group for membership in user.groups.all()):
        return None
    return (
        f"Only {group} may resolve {kind_for(kind).label.lower()}s (the owner group on the five-checks page), "
        "or the person an item was given to; you are neither."
    )


def review_resolver_rule(user: Any, *, kind: str | None, owner: Any, permission: str = perms.RESOLVE) -> None:
    refusal = resolver_refusal(user=user, kind=kind, owner=owner, permission=permission)
    if refusal is not None:
        raise ReviewRefused(refusal, code="not_allowed", status=403)


def review_owner_rule(user: Any, owner: Any) -> None:
    refusal = owner_rule_refusal(user=user, owner=owner)
    if refusal is not None:
        raise ReviewRefused(refusal, code="not_owner", status=403)


def review_may_work(user: Any, *, kind: str | None, owner: Any, permission: str = perms.RESOLVE) -> None:
    """Refuse unless ``user`` may work on an item of ``kind`` owned by ``owner``: the resolver
    rule, then the owner rule: the checks every change to a review item starts with."""
    review_resolver_rule(user, kind=kind, owner=owner, permission=permission)
    review_owner_rule(user, owner)


def review_action(action_pk: int, *, lock: bool = False) -> Action:
    queryset = Action.objects.select_for_update(of=("self",)) if lock else Action.objects
    try:
        return queryset.select_related("owner").get(pk=action_pk)
    except Action.DoesNotExist as missing:
        raise ReviewRefused("There is no such action.", code="not_found", status=404) from missing


def review_stamp(now: datetime, user: Any, what: str, note: str) -> str:
    line = f"[{timezone.localtime(now):%Y-%m-%d %H:%M} {user.get_username()}] {what}"
    return f"{line}: {note}" if note else line


# --- what the receiver's answer allows ------------------------------------------------------------


def effects_text(effects: list[Effect]) -> str:
    return ", ".join(f"{effect.reference} ({effect.status})" for effect in effects)


def conflict_with_succeeded(action: Action, lookup: Lookup | None, reference: str) -> str | None:
    if lookup is None:
        return None  # a receiver with no lookup: the person's evidence is the record
    noun = kind_for(action.kind).explanations.noun
    who = kind_for(action.kind).contract().receiver
    if lookup.verdict == LookupVerdict.INCONCLUSIVE:
        return f"The {who} could not confirm it ({lookup.error}). Nothing is recorded as succeeded without its answer."
    if lookup.verdict == LookupVerdict.NOT_FOUND:
        return f"The {who} has no {noun} for this action, so it cannot be confirmed as succeeded."
    if lookup.verdict == LookupVerdict.DUPLICATE:
        # Confirming the one named effect books the amount once; the other effect stays on record
        # as a discrepancy (reconciliation stored it), to be corrected by a compensating action.
        named = [effect for effect in lookup.effects if effect.reference == reference]
        if not named:
            return (
                f"The {who} has {len(lookup.effects)} of them for this action ({effects_text(lookup.effects)}). "
                "Name the one to record as this action's effect; the other stays open as a discrepancy."
            )
        effect = named[0]
    else:
        effect = lookup.effects[0]
    if effect.reference != reference:
        return f"The {who}'s {noun} for this action is {effect.reference}, not {reference}."
    if effect.outcome != Outcome.SUCCEEDED:
        return f"The {who}'s {noun} {effect.reference} is {effect.status}, not succeeded."
    expected = kind_for(action.kind).expected_amount_minor(action)
    if (expected is not None and effect.amount_minor != expected) or effect.currency.upper() != action.currency:
        return (
            f"The {who}'s {noun} {effect.reference} is for {effect.amount_minor} {effect.currency.upper()} "
            f"(minor units), not {expected} {action.currency}."
        )
    return None


def conflict_with_not_executed(action: Action, lookup: Lookup | None, *, retry: bool) -> str | None:
    who = kind_for(action.kind).contract().receiver
    if lookup is None:
        if retry:
            return f"The {who} offers no lookup, so nothing can prove that sending again would not repeat it."
        return None
    noun = kind_for(action.kind).explanations.noun
    effects = lookup.live_effects
    if effects:
        what = "retried" if retry else "recorded as failed"
        return (
            f"The {who} shows {effects_text(effects)} for this action: the {noun} exists, so it cannot be {what}. "
            "Confirm it as succeeded, or wait for it to settle."
        )
    if lookup.verdict == LookupVerdict.INCONCLUSIVE:
        if not retry and lookup.target_missing:
            return None  # the receiver has no such target: no effect can exist on it
        return f"The {who} could not be asked ({lookup.error}). Try again in a moment."
    if retry and lookup.verdict != LookupVerdict.NOT_FOUND:
        return f"The {who} has records for this action ({effects_text(lookup.effects)}): a retry is not safe."
    return None


def retry_timing_refusal(action: Action, contract: ReceiverContract, now: datetime) -> str | None:
    if not contract.lookup_authoritative:
        return (
            f"The {contract.receiver}'s lookups are not authoritative: "
            "a not-found answer does not prove a retry is safe."
        )
    visible_after = (action.last_attempt_at or action.first_attempt_at or now) + contract.lookup_visibility_delay
    if now < visible_after:
        return (
            f"The {contract.receiver}'s lookup may still be catching up until {visible_after:%H:%M:%S}. Try again then."
        )
    return None


def failed_timing_refusal(action: Action, contract: ReceiverContract, now: datetime) -> str | None:
    """A not-found proves "failed" only once no earlier attempt can still arrive at the receiver.

    Recording failed releases the reservation and opens the kind's follow-up (the person affected
    is served another way): if the effect then appeared, it would have happened twice.
    """
    timing = retry_timing_refusal(action, contract, now)
    if timing is not None:
        return timing
    last = action.last_attempt_at or action.first_attempt_at
    if last is None:
        return None
    quiet_after = last + timedelta(seconds=settings.LEASE_SECONDS) + contract.lookup_visibility_delay
    if now < quiet_after:
        return (
            f"The last attempt ({last:%H:%M:%S}) could still reach the {contract.receiver} "
            f"until {quiet_after:%H:%M:%S}: "
            "record it as failed after that, once a lookup still finds nothing."
        )
    return None
