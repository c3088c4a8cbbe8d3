"""Writes to the intent log. Every state change goes through a function here (or in
``approvals.services`` / ``actions.execution``), runs in one transaction and writes its audit
event in that same transaction."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_fsm import has_transition_perm

from actions.foundation.refusals import Refused
from actions.foundation.trail import Actor, Writes, action_transition, event_record
from actions.kinds.fields import (
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_evidence,
    check_reason_code,
    check_reference,
    check_request_number,
    parse_amount,
)
from actions.kinds.refund import refund_action_id
from actions.kinds.registry import kind_for
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    ActorKind,
    Order,
    RefundRequest,
)
from actions.providers.base import validate_idempotency_key
from approvals.policy import auto_policy_apply, auto_policy_decide

if TYPE_CHECKING:
    pass

S = ActionStatus

# --- proposals ----------------------------------------------------------------------------


class ProposalConflict(Exception):
    """The action id exists with a different material payload: a different business action."""

    def __init__(self, action: Action, differing: dict[str, dict[str, Any]]) -> None:
        self.action = action
        self.differing = differing
        names = ", ".join(sorted(differing))
        super().__init__(
            f"{action.action_id} already exists with a different {names}. A different amount or "
            "reason is a different business action: open a new refund request for it."
        )


@dataclass
class ProposalResult:
    action: Action
    created: bool
    problems: list[FieldProblem] = field(default_factory=list)


def payload_canonical_json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_hash(payload: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(payload_canonical_json(payload).encode()).hexdigest()


# The key under which a payload carries its kind's composition version. A payload without it
# was composed before kinds had versions: version 0.
PAYLOAD_SCHEMA_KEY = "schema_version"


def payload_versioned(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload a kind composed, stamped with the kind's ``payload_schema_version``: what
    is stored and hashed, so that the hash says which composition it is the hash of."""
    return {**payload, PAYLOAD_SCHEMA_KEY: kind_for(str(payload["kind"])).payload_schema_version}


def _differing_fields(existing: dict[str, Any], proposed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keys = set(existing) | set(proposed)
    return {
        key: {"existing": existing.get(key), "proposed": proposed.get(key)}
        for key in sorted(keys)
        if existing.get(key) != proposed.get(key)
    }


def payload_differences(action: Action, payload: dict[str, Any], digest: str) -> dict[str, dict[str, Any]]:
    """What makes ``payload`` another proposal than the one ``action`` holds; empty for the same one.

    Composed the same way (one schema version), only an identical payload is the same proposal.
    Composed by two versions of the kind (a retry that crossed a release), the fields the two
    compositions share decide: a field one of them adds or drops is not the client's to send
    again, so an identical retry replays the action instead of meeting a 409, and a different
    amount is still a conflict.
    """
    if action.payload_hash == digest:
        return {}
    existing = action.payload
    if existing.get(PAYLOAD_SCHEMA_KEY, 0) == payload.get(PAYLOAD_SCHEMA_KEY, 0):
        return _differing_fields(existing, payload)
    shared = (existing.keys() & payload.keys()) - {PAYLOAD_SCHEMA_KEY}
    return _differing_fields({k: existing[k] for k in shared}, {k: payload[k] for k in shared})


def existing_or_conflict(action: Action, payload: dict[str, Any], digest: str) -> ProposalResult:
    differing = payload_differences(action, payload, digest)
    if not differing:
        return ProposalResult(action=action, created=False)
    raise ProposalConflict(action, differing)


def _race_winner(action_id: str, payload: dict[str, Any], digest: str) -> ProposalResult | None:
    """After a proposal's INSERT met the UNIQUE action id: the row that holds it (same payload)
    or ProposalConflict; None when no row holds it, i.e. the IntegrityError was not that race."""
    winner = Action.objects.filter(action_id=action_id).first()
    return None if winner is None else existing_or_conflict(winner, payload, digest)


class ProposalRaceLost(Exception):
    """Another transaction inserted this action id first (``proposal_record(savepoint=False)``).

    Raised out of the proposal's own transaction, which PostgreSQL has aborted: the winner's row
    is read once that transaction has ended (``answers_a_lost_proposal_race``).
    """

    def __init__(self, action: Action) -> None:
        self.action_id = action.action_id
        self.payload = action.payload
        self.payload_hash = action.payload_hash
        super().__init__(f"{action.action_id} was inserted by another proposal first.")

    def result(self) -> ProposalResult:
        """The winner (same payload) or ProposalConflict; the original IntegrityError when no
        row holds the action id, i.e. when a race on the id was not what failed."""
        result = _race_winner(self.action_id, self.payload, self.payload_hash)
        if result is None:
            raise self.__cause__ or self
        return result


Params = ParamSpec("Params")


def answers_a_lost_proposal_race(
    propose: Callable[Params, ProposalResult],
) -> Callable[Params, ProposalResult]:
    """For a proposal function whose whole body is one transaction that calls
    ``proposal_record(savepoint=False)``: a lost race on the action id returns the winner, read
    after the transaction rolled back, as the savepoint path does inside it."""

    @functools.wraps(propose)
    def propose_or_read_the_winner(*args: Params.args, **kwargs: Params.kwargs) -> ProposalResult:
        try:
            return propose(*args, **kwargs)
        except ProposalRaceLost as race:
            return race.result()

    return propose_or_read_the_winner


@answers_a_lost_proposal_race
def action_propose_refund(
    *,
    order_number: object,
    request_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate a refund proposal deterministically and record it.

    - Bad input raises ProposalInvalid and writes nothing (invariant 11).
    - The same action id with the same payload returns the existing action (``created`` False).
    - The same action id with another payload raises ProposalConflict naming the fields.
    - A proposal that is well-formed but against policy (refund window past) is recorded as
      REJECTED with its reasons.
    - An auto-approvable proposal is authorized in the same transaction (one commit).
    """
    now = now or timezone.now()
    problems: list[FieldProblem] = []
    order_ref = check_reference("order_number", order_number, problems)
    number = check_request_number(request_number, problems)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    reason = check_reason_code(reason_code, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert order_ref is not None and number is not None and currency_code is not None
    assert money is not None and reason is not None

    with transaction.atomic(durable=True):
        # The request and its order in one read; which of the two is missing is asked only
        # when one is. An agent proposing against another agent's request finds no request,
        # with the same answer as for a number that does not exist.
        request = (
            RefundRequest.objects.visible_to(proposer.agent)
            .select_related("order")
            .filter(order__number=order_ref, number=number)
            .first()
        )
        if request is None and not Order.objects.filter(number=order_ref).exists():
            raise ProposalInvalid([FieldProblem("order_number", "not_found", f"There is no order {order_ref}.")])
        if request is None:
            raise ProposalInvalid(
                [FieldProblem("request_number", "not_found", f"Order {order_ref} has no refund request {number}.")]
            )
        order = request.order
        if not order.charge_reference:
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "order_number",
                        "no_charge",
                        f"Order {order_ref} has no payment at the provider to refund.",
                    )
                ]
            )
        if currency_code != order.currency:
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "currency",
                        "currency_mismatch",
                        f"Order {order_ref} was paid in {order.currency}, not {currency_code}.",
                    )
                ]
            )

        action_id = refund_action_id(order_number=order.number, request_number=request.number)
        validate_idempotency_key(action_id)
        payload = payload_versioned({
            "kind": ActionKind.REFUND.value,
            "order": order.number,
            "request": request.number,
            "charge": order.charge_reference,
            "amount": str(money),
            "currency": currency_code,
            "reason_code": reason,
        })
        digest = payload_hash(payload)

        if money > order.refundable_amount:
            # An identical retry returns what exists, even when the first proposal's own
            # reservation is what now leaves too little (a new proposal meets the UNIQUE action
            # id in proposal_record instead, without a read first).
            existing = Action.objects.filter(action_id=action_id).first()
            if existing is not None:
                return existing_or_conflict(existing, payload, digest)
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "amount",
                        "over_refundable_balance",
                        f"{money} {currency_code} is more than the refundable balance of order {order_ref} "
                        f"({order.refundable_amount} {currency_code}: captured {order.captured_amount}, "
                        f"refunded {order.refunded_amount}, reserved {order.reserved_amount}).",
                    )
                ]
            )

        policy_reasons: list[dict[str, str]] = []
        window = timedelta(days=settings.REFUND_WINDOW_DAYS)
        if order.paid_at + window < now:
            policy_reasons.append(
                {
                    "code": "refund_window_past",
                    "message": f"The refund window of {window.days} days ended on {(order.paid_at + window):%Y-%m-%d}.",
                }
            )

        actor_user = proposer.accountable_user
        action = Action(
            action_id=action_id,
            kind=ActionKind.REFUND,
            idempotency_key=action_id,
            payload=payload,
            payload_hash=digest,
            order=order,
            refund_request=request,
            amount=money,
            currency=currency_code,
            reason_code=reason,
            evidence=evidence_text,
            proposed_by_agent=proposer.agent,
            proposed_by_user=actor_user if getattr(actor_user, "pk", None) else None,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=policy_reasons,
            event_evidence={"payload": payload, "payload_hash": digest, "evidence": evidence_text},
            auto_policy=True,
            savepoint=False,
        )


def proposal_record(
    *,
    action: Action,
    proposer: Actor,
    now: datetime,
    policy_reasons: list[dict[str, str]],
    event_evidence: dict[str, Any],
    auto_policy: bool,
    reason: str = "",
    savepoint: bool = True,
) -> ProposalResult:
    """Record a new, validated proposal of any kind. Call inside the proposal's transaction.

    The UNIQUE action id makes concurrent proposals produce one row: the loser returns the
    winner (same payload) or raises ProposalConflict. A proposal against policy is recorded as
    REJECTED with its reasons. ``auto_policy``: the auto-approval policy may authorize it in the
    same transaction (one commit).

    ``savepoint``: the INSERT runs in a savepoint, so that a lost race leaves the caller's
    transaction usable for reading the winner. A caller whose transaction holds nothing else
    (a proposal function decorated with ``answers_a_lost_proposal_race``) passes False and saves
    the SAVEPOINT and RELEASE statements of every proposal (issue 18): a lost race then raises
    ProposalRaceLost, which ends the transaction, and the winner is read after it.
    """
    if policy_reasons:
        action.reject_proposal(reasons=policy_reasons)
    else:
        action.propose()
    action.status_changed_at = now

    # The proposal's event and the policy's approval event are two state changes of one agent's
    # action in one transaction: its webhook is read once for both, and the events (with a
    # cap's hold, if one holds it) are inserted together, in order, at the end.
    writes = Writes()
    # The auto-approval policy decides before the INSERT (it locks the target and the agent
    # and reads the caps, writing nothing), so that an approved proposal is inserted
    # AUTHORIZED: no UPDATE after it (issue 18). A lost race on the action id below then
    # finds the winner after the same locks.
    decision = (
        auto_policy_decide(action=action, now=now, writes=writes)
        if auto_policy and action.status == S.PROPOSED
        else None
    )
    if decision is not None and decision.held is None:
        action.approve()
    if not savepoint:
        try:
            action.save()
        except IntegrityError as lost:
            raise ProposalRaceLost(action) from lost
    else:
        try:
            # A savepoint, so that losing the race on the UNIQUE action id leaves the outer
            # transaction usable for reading the winner's row.
            with transaction.atomic():
                action.save()
        except IntegrityError:
            result = _race_winner(action.action_id, action.payload, action.payload_hash)
            if result is None:
                raise  # not a race on the action id
            return result
    if abs(action.created_at - now) > timedelta(seconds=1):
        # ``auto_now_add`` stamps the clock, not the proposal's time: a proposal recorded
        # with its own time (an import, the demo's history) would show "a minute ago" on its
        # card and "2 days ago" in its trail. The card and the trail read the same time.
        Action.objects.filter(pk=action.pk).update(created_at=now)
        action.created_at = now

    event_record(
        action=action,
        transition="propose" if not policy_reasons else "reject_proposal",
        from_state="",
        to_state=S.PROPOSED if not policy_reasons else S.REJECTED,
        actor=proposer,
        reason="; ".join(r["message"] for r in policy_reasons) or reason or "Validation passed.",
        evidence=event_evidence,
        now=now,
        writes=writes,
    )
    if decision is not None:
        auto_policy_apply(action=action, decision=decision, now=now, transitioned=True, writes=writes)
    writes.write()
    return ProposalResult(action=action, created=True)


class ActionRefused(Refused, PermissionDenied):
    """The actor may not make this change (cancel). Django shows it as its 403 page."""

    default_status = 403


def action_cancel(*, action_pk: int, actor: Actor, reason: str) -> Action:
    """Cancel an action before any reservation was made (managers and admins)."""
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        if actor.kind != ActorKind.SYSTEM and not has_transition_perm(action.cancel, actor.user):
            raise ActionRefused("Only managers and admins may cancel an action.")
        action_transition(action=action, transition="cancel", actor=actor, reason=reason)
    return action
