"""Finance's changes besides resolutions: owners of review items, and the follow-up workflow
of remedies and discrepancies.

The resolutions of actions that need review are the engine's (``actions.engine.resolutions``),
the same for every kind. Every function here checks permission itself (a view's check is a
courtesy, this one is the rule), refuses bad input before writing anything, and makes its change
and its audit record in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from actions import permissions as perms
from actions.engine.resolution_checks import (
    ReviewRefused,
    resolver_refusal,
    review_action,
    review_may_work,
    review_require,
    review_stamp,
    review_text,
)
from actions.foundation.separation import follow_up_admin_refusal
from actions.foundation.trail import Actor, event_record
from actions.kinds import owner_group_of
from actions.models import (
    Action,
    ActionStatus,
    Discrepancy,
    DiscrepancyStatus,
    FollowUpStatus,
    Remedy,
    RemedyKind,
)
from actions.review.rules import follow_up_kind

S = ActionStatus

RESOLVE_PERMISSION = perms.RESOLVE
REMEDY_PERMISSION = perms.CHANGE_REMEDY
DISCREPANCY_PERMISSION = perms.CHANGE_DISCREPANCY
FollowUpModel = type[Remedy] | type[Discrepancy]
# The remedies a person may choose when a refund failed for good.
REMEDY_CHOICES = (RemedyKind.STORE_CREDIT, RemedyKind.MANUAL_TRANSFER, RemedyKind.CHEQUE, RemedyKind.NONE)


def _remedy_kind(raw: object, *, allow_undecided: bool = False) -> str:
    value = str(raw or "")
    allowed = [choice.value for choice in REMEDY_CHOICES]
    if allow_undecided:
        allowed.append(RemedyKind.UNDECIDED.value)
    if value not in allowed:
        names = ", ".join(str(RemedyKind(choice).label).lower() for choice in allowed)
        raise ReviewRefused(f"remedy_kind: choose one of {names}.", code="invalid", status=400, field="remedy_kind")
    return value


def _new_owner(owner_pk: object, *, kind: str | None, permission: str) -> Any:
    """The person an item of ``kind`` is (re)assigned to, checked by the same rule as the people
    the Reassign list offers (``resolver_candidates``): active, and allowed to resolve the kind
    without being given it. Holding the permission alone is not enough: a superuser holds every
    permission, and a forged form must not hand an item to someone the list would never show
    (who, once its owner, could resolve it)."""
    group = owner_group_of(kind) if kind is not None else "the people who work it"
    if owner_pk == "":
        # The Reassign list's "Choose…" left as it was: to assign it to oneself is another form.
        raise ReviewRefused(
            f"owner: choose whom to reassign it to, a member of {group}.", code="invalid", status=400, field="owner"
        )
    try:
        pk = int(str(owner_pk))
    except (TypeError, ValueError):
        raise ReviewRefused(f"owner: choose a member of {group}.", code="invalid", status=400, field="owner") from None
    owner = get_user_model().objects.filter(pk=pk, is_active=True).first()
    if owner is None or resolver_refusal(user=owner, kind=kind, owner=None, permission=permission) is not None:
        raise ReviewRefused(
            f"owner: that person is not an active member of {group}.", code="invalid", status=400, field="owner"
        )
    return owner


# --- owners --------------------------------------------------------------------------------------


def action_assign(*, action_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Action:
    """Make ``owner_pk`` (default: ``user``) the action's named owner. The status does not change,
    so the audit event runs from the status to itself (the trail stays a valid chain)."""
    review_require(user, RESOLVE_PERMISSION, "Only finance may take or reassign actions in the review queue.")
    note = review_text(note, name="note", required=False, label="")
    now = timezone.now()
    with transaction.atomic(durable=True):
        action = review_action(action_pk, lock=True)
        if action.status not in (S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW):
            raise ReviewRefused(
                f"{action.action_id} is {action.get_status_display().lower()}: there is nothing left to own.",
                code="not_open",
            )
        # Whoever may work the item may take it or pass it on, and only to someone who may too.
        review_may_work(user, kind=action.kind, owner=action.owner)
        owner = user if owner_pk is None else _new_owner(owner_pk, kind=action.kind, permission=RESOLVE_PERMISSION)
        if action.owner is not None and action.owner.pk == owner.pk:
            raise ReviewRefused(f"{action.action_id} already belongs to {owner.get_username()}.", code="unchanged")
        reason = note or f"Assigned to {owner.get_username()} by {user.get_username()}."
        action_owner_record(action=action, owner=owner, user=user, reason=reason, now=now)
    return action


def action_owner_record(*, action: Action, owner: Any, user: Any, reason: str, now: datetime) -> None:
    """Name ``owner`` as the locked action's owner (finance's assignment, the admin's
    reassignment), with the audit event that says who and why. The status does not change, so
    the event runs from the status to itself (the trail stays a valid chain)."""
    previous = action.owner
    action.owner = owner
    action.save(update_fields=["owner", "updated_at"])
    event_record(
        action=action,
        transition="assign_owner",
        from_state=action.status,
        actor=Actor.for_user(user),
        reason=reason,
        evidence={"owner": owner.get_username(), "previous_owner": previous.get_username() if previous else None},
        now=now,
    )


def _follow_up_locked(model: FollowUpModel, pk: int) -> Any:
    """The follow-up, with its owner and action, locked until the transaction ends."""
    item = model.objects.select_for_update(of=("self",)).select_related("owner", "action").filter(pk=pk).first()
    if item is None:
        raise ReviewRefused(f"There is no such {model._meta.verbose_name}.", code="not_found", status=404)
    return item


def _follow_up_assign(model: FollowUpModel, pk: int, *, user: Any, owner_pk: object, note: str) -> Any:
    name = model._meta.verbose_name
    permission = _FOLLOW_UPS[model].permission
    review_require(user, permission, f"Only finance may take or reassign a {name}.")
    note = review_text(note, name="note", required=False, label="")
    now = timezone.now()
    with transaction.atomic(durable=True):
        item = _follow_up_locked(model, pk)
        if item.status not in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS):
            raise ReviewRefused(f"This {name} is closed: there is nothing left to own.", code="not_open")
        kind = follow_up_kind(item)
        review_may_work(user, kind=kind, owner=item.owner, permission=permission)
        owner = user if owner_pk is None else _new_owner(owner_pk, kind=kind, permission=permission)
        previous = item.owner
        if previous is not None and previous.pk == owner.pk:
            raise ReviewRefused(f"This {name} already belongs to {owner.get_username()}.", code="unchanged")
        item.owner = owner
        item.note = _join(item.note, review_stamp(now, user, f"assigned to {owner.get_username()}", note))
        item.save(update_fields=["owner", "note", "updated_at"])
        _follow_up_event(item, transition=f"{model._meta.model_name}_assign_owner", user=user, note=note, now=now)
    return item


def remedy_assign(*, remedy_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Remedy:
    item: Remedy = _follow_up_assign(Remedy, remedy_pk, user=user, owner_pk=owner_pk, note=note)
    return item


def discrepancy_assign(*, discrepancy_pk: int, user: Any, owner_pk: object = None, note: str = "") -> Discrepancy:
    item: Discrepancy = _follow_up_assign(Discrepancy, discrepancy_pk, user=user, owner_pk=owner_pk, note=note)
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


# --- follow-ups: open -> in progress -> done (remedies) / explained | corrected (discrepancies) ----

REMEDY_FLOW = {FollowUpStatus.OPEN: {FollowUpStatus.IN_PROGRESS}, FollowUpStatus.IN_PROGRESS: {FollowUpStatus.DONE}}
DISCREPANCY_FLOW = {
    DiscrepancyStatus.OPEN: {DiscrepancyStatus.IN_PROGRESS},
    DiscrepancyStatus.IN_PROGRESS: {DiscrepancyStatus.EXPLAINED, DiscrepancyStatus.CORRECTED},
}


@dataclass(frozen=True)
class _FollowUpRules:
    """A kind of follow-up's statuses, the moves between them, and the permission to work on it."""

    statuses: type[FollowUpStatus] | type[DiscrepancyStatus]
    flow: Mapping[Any, set[Any]]
    permission: str


_FOLLOW_UPS: dict[FollowUpModel, _FollowUpRules] = {
    Remedy: _FollowUpRules(FollowUpStatus, REMEDY_FLOW, REMEDY_PERMISSION),
    Discrepancy: _FollowUpRules(DiscrepancyStatus, DISCREPANCY_FLOW, DISCREPANCY_PERMISSION),
}


def _advance(
    model: FollowUpModel, pk: int, *, user: Any, to_status: object, note: object, remedy_kind: object = None
) -> Any:
    name = model._meta.verbose_name
    rules = _FOLLOW_UPS[model]
    permission = rules.permission
    review_require(user, permission, f"Only finance may work on a {name}.")
    # Separation of duties holds whatever permissions a superuser or a stray grant carries.
    refusal = follow_up_admin_refusal(user=user)
    if refusal is not None:
        raise ReviewRefused(refusal, code="not_allowed", status=403)
    target = str(to_status or "")
    choices = {status.value: status for status in rules.statuses}
    if target not in choices:
        raise ReviewRefused(
            f"status: {target[:40]!r} is not a {name} status.", code="invalid", status=400, field="status"
        )
    finishing = target not in (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS)
    text = review_text(note, name="note", required=finishing, label=f"say what was done before closing the {name}.")
    kind = _remedy_kind(remedy_kind, allow_undecided=True) if remedy_kind not in (None, "") else None
    now = timezone.now()
    with transaction.atomic(durable=True):
        item = _follow_up_locked(model, pk)
        review_may_work(user, kind=follow_up_kind(item), owner=item.owner, permission=permission)
        if target not in {status.value for status in rules.flow.get(item.status, set())}:
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
        item.note = _join(
            item.note, review_stamp(now, user, f"{previous} -> {item.get_status_display().lower()}", text)
        )
        item.save(update_fields=fields)
        _follow_up_event(item, transition=f"{model._meta.model_name}_{target}", user=user, note=text, now=now)
    return item


def remedy_advance(
    *, remedy_pk: int, user: Any, to_status: object, note: object = "", remedy_kind: object = None
) -> Remedy:
    """Move a remedy on: open -> in progress -> done. Closing needs a note and a decided kind."""
    item: Remedy = _advance(Remedy, remedy_pk, user=user, to_status=to_status, note=note, remedy_kind=remedy_kind)
    return item


def discrepancy_advance(*, discrepancy_pk: int, user: Any, to_status: object, note: object = "") -> Discrepancy:
    """Move a discrepancy on: open -> in progress -> explained or corrected. Closing needs a note."""
    item: Discrepancy = _advance(Discrepancy, discrepancy_pk, user=user, to_status=to_status, note=note)
    return item
