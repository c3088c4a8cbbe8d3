"""Recording a proposal of any kind, opening the request a proposal answers, and cancelling an
action (docs/architecture.md section 3).

Each kind's proposal service (``actions.kinds.<kind>.proposal``) checks its own fields and
composes its id and payload, then records the proposal here, in steps every kind shares: the
payload's hash, the identical retry or the conflict, the auto-approval policy's decision, the
INSERT that a race on the UNIQUE action id may lose, and the "propose" event, all in the
proposal's one transaction.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Max
from django_fsm import has_transition_perm

from actions.foundation.refusals import Refused
from actions.foundation.tracing import traced
from actions.foundation.trail import Actor, Writes, action_transition, event_record
from actions.kinds.fields import FieldProblem, ProposalInvalid, RequestFieldNames
from actions.kinds.registry import kind_for
from actions.models import Action, ActionStatus, ActorKind, AdjustmentRequest, Agent, Bill, Order, RefundRequest
from actions.providers.base import validate_idempotency_key
from approvals.policy import AutoPolicyDecision, auto_policy_apply, auto_policy_decide

S = ActionStatus

# --- requests -----------------------------------------------------------------------------
#
# A request (a refund request on an order, an adjustment request on a bill) is numbered per
# target, under the target's row lock, and is idempotent by its external reference: a retry
# returns the request that exists. Each kind with requests declares its ``RequestBook``.

Request = TypeVar("Request", AdjustmentRequest, RefundRequest)


class RequestConflict(Exception):
    """The external reference already names a request on another target."""

    # The request and its target in a clerk's words ("a refund request", "order"), and what one
    # request stands for ("One ticket").
    request_words: ClassVar[str]
    target_words: ClassVar[str]
    one_request_is: ClassVar[str]

    def __init__(self, request: Any, differing: dict[str, dict[str, Any]]) -> None:
        self.request = request
        self.differing = differing
        target = getattr(request, self.target_words)
        super().__init__(
            f"The external reference {request.external_reference!r} already belongs to {self.request_words} on "
            f"{self.target_words} {target.number}. {self.one_request_is} is one request: use another reference "
            f"for another {self.target_words}."
        )


class RequestTaken(Exception):
    """The external reference names a request another agent opened. Nothing is revealed about it."""


@dataclass(frozen=True)
class RequestOpened(Generic[Request]):
    """A request just opened (``created``), or the one its external reference opened before."""

    request: Request
    created: bool
    # Its target's number and its own, by the names the agent gives them (the interfaces' log
    # lines name it so): {"order_number": "4821", "request_number": 2}.
    numbers: dict[str, Any]


@dataclass(frozen=True)
class RequestBook(Generic[Request]):
    """A kind's requests on its targets (refund requests on orders), and what refuses a reference:
    ``taken`` when another agent opened it, ``conflict`` when it names a request on another target.
    ``names`` are what the agent calls a request's target's number and its own."""

    model: type[Request]
    target_model: type[Bill | Order]
    taken: type[RequestTaken]
    conflict: type[RequestConflict]
    names: RequestFieldNames

    def open(
        self,
        target_number: str,
        reference: str,
        *,
        opened_by_agent: Agent | None,
        before_create: Callable[[Any], None] = lambda target: None,
        **fields: Any,
    ) -> RequestOpened[Request]:
        """Open the next request on the target numbered ``target_number``, or return the one
        ``reference`` opened, in a transaction of its own.

        The target's row is locked while the next number is chosen, so two requests on one
        target are numbered one after the other. A request another agent opened raises
        ``taken``, and nothing is revealed about it; one on another target raises ``conflict``,
        naming both. ``before_create`` runs, under the lock, only when a new request is about to
        be written (a limit to check).
        """
        # The target's field on the request ("order", "bill") names it in the agent's words too.
        target_field = self.target_model._meta.model_name
        assert target_field is not None
        with transaction.atomic(durable=True):
            target = self.target_model.objects.select_for_update().filter(number=target_number).first()
            if target is None:
                raise ProposalInvalid.for_field(
                    f"{target_field}_number", "not_found", f"There is no {target_field} {target_number}."
                )
            requests = self.model.objects.select_related(target_field).filter(external_reference=reference)
            # Read after taking the lock: a concurrent opener of the same reference on this target
            # has committed by now, and this statement sees its row.
            request = requests.first()
            created = request is None
            if request is None:
                before_create(target)
                number = (
                    self.model.objects.filter(**{target_field: target}).aggregate(top=Max("number"))["top"] or 0
                ) + 1
                try:
                    # A savepoint: the same reference opened concurrently on another target is not
                    # serialised by this target's lock, and the UNIQUE constraint decides. The
                    # savepoint keeps the transaction usable for reading the winner.
                    with transaction.atomic():
                        request = self.model.objects.create(
                            **{target_field: target},
                            number=number,
                            external_reference=reference,
                            opened_by_agent=opened_by_agent,
                            **fields,
                        )
                except IntegrityError:
                    request = requests.first()
                    if request is None:
                        raise
                    created = False
            if (
                not created
                and opened_by_agent is not None
                and request.opened_by_agent_id not in (None, opened_by_agent.pk)
            ):
                raise self.taken(request.external_reference)
            opened_on = getattr(request, target_field).number
            if opened_on != target.number:
                raise self.conflict(
                    request, {f"{target_field}_number": {"existing": opened_on, "proposed": target.number}}
                )
        return RequestOpened(
            request, created, numbers={self.names.target: target.number, self.names.request: request.number}
        )


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


def existing_proposal(action_id: str, payload: dict[str, Any], digest: str) -> ProposalResult | None:
    """The action that holds ``action_id`` when its payload is the same (an identical retry,
    ``created`` False), or ProposalConflict naming the differing fields; None when no action
    holds it. After a proposal's INSERT met the UNIQUE action id, None means the IntegrityError
    was not that race."""
    existing = Action.objects.filter(action_id=action_id).first()
    return None if existing is None else existing_or_conflict(existing, payload, digest)


def action_new(
    *,
    kind: str,
    action_id: str,
    payload: dict[str, Any],
    digest: str,
    proposer: Actor,
    evidence: str,
    **target: Any,
) -> Action:
    """An unsaved proposal of ``kind`` by ``proposer``: its id is its idempotency key (section 3).
    ``target`` holds the kind's own columns (its target, amount, currency, reason code)."""
    actor_user = proposer.accountable_user
    return Action(
        action_id=action_id,
        kind=kind,
        idempotency_key=action_id,
        payload=payload,
        payload_hash=digest,
        evidence=evidence,
        proposed_by_agent=proposer.agent,
        proposed_by_user=actor_user if getattr(actor_user, "pk", None) else None,
        **target,
    )


@dataclass(frozen=True)
class ProposalDraft:
    """A kind's proposal as composed, not yet recorded: its id, its payload stamped with the
    kind's schema version, and that payload's hash. The steps every kind's proposal shares
    between its own checks: compose, look for an identical retry, record."""

    action_id: str
    payload: dict[str, Any]
    digest: str

    @classmethod
    def compose(cls, action_id: str, payload: dict[str, Any]) -> ProposalDraft:
        """The draft of ``payload`` under ``action_id``; an id unfit as an idempotency key is refused."""
        validate_idempotency_key(action_id)
        versioned = payload_versioned(payload)
        return cls(action_id=action_id, payload=versioned, digest=payload_hash(versioned))

    def existing(self) -> ProposalResult | None:
        """The identical retry's action, ProposalConflict, or None: ``existing_proposal``."""
        return existing_proposal(self.action_id, self.payload, self.digest)

    def existing_or_record(self, proposer: Actor, **record: Any) -> ProposalResult:
        """The identical retry's action (or ProposalConflict) when the id is taken; otherwise the
        draft recorded, as ``record`` does with ``record``'s arguments."""
        existing = self.existing()
        return existing if existing is not None else self.record(proposer, **record)

    def record(
        self,
        proposer: Actor,
        *,
        now: datetime,
        evidence: str,
        evidence_label: str = "evidence",
        policy_reasons: list[dict[str, str]] | None = None,
        auto_policy: bool = True,
        reason: str = "",
        **columns: Any,
    ) -> ProposalResult:
        """Record the draft as a new action of its payload's kind, inside the proposal's one
        transaction (``proposal_record(savepoint=False)``: the proposal function carries
        ``answers_a_lost_proposal_race``). ``columns``: the kind's own (target, amount, currency,
        reason code); ``evidence_label``: what the proposal's event calls ``evidence``."""
        action = action_new(
            kind=str(self.payload["kind"]),
            action_id=self.action_id,
            payload=self.payload,
            digest=self.digest,
            proposer=proposer,
            evidence=evidence,
            **columns,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=policy_reasons or [],
            event_evidence={"payload": self.payload, "payload_hash": self.digest, evidence_label: evidence},
            auto_policy=auto_policy,
            reason=reason,
            savepoint=False,
        )


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
        result = existing_proposal(self.action_id, self.payload, self.payload_hash)
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


@traced("action.propose", outcome=lambda result: str(result.action.status))
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
    the SAVEPOINT and RELEASE statements of every proposal: a lost race then raises
    ProposalRaceLost, which ends the transaction, and the winner is read after it.
    """
    proposal_state_set(action, policy_reasons=policy_reasons, now=now)
    # The proposal's event and the policy's approval event are two state changes of one agent's
    # action in one transaction: its webhook is read once for both, and the events (with a
    # cap's hold, if one holds it) are inserted together, in order, at the end.
    writes = Writes()
    decision = auto_policy_decide_before_insert(action, auto_policy=auto_policy, now=now, writes=writes)
    winner = proposal_insert(action, savepoint=savepoint)
    if winner is not None:
        return winner
    created_at_set_to_proposal_time(action, now=now)

    writes.new_actions.add(action.pk)  # its trail starts here: no previous event to read
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


def proposal_state_set(action: Action, *, policy_reasons: list[dict[str, str]], now: datetime) -> None:
    """PROPOSED, or REJECTED with the policy's reasons: a proposal against policy is still recorded."""
    if policy_reasons:
        action.reject_proposal(reasons=policy_reasons)
    else:
        action.propose()
    action.status_changed_at = now


def auto_policy_decide_before_insert(
    action: Action, *, auto_policy: bool, now: datetime, writes: Writes
) -> AutoPolicyDecision | None:
    """The auto-approval policy decides before the INSERT (it locks the target and the agent
    and reads the caps, writing nothing), so that an approved proposal is inserted AUTHORIZED:
    no UPDATE after it. A lost race on the action id then finds the winner after the
    same locks. None when the policy does not decide this proposal."""
    if not auto_policy or action.status != S.PROPOSED:
        return None
    decision = auto_policy_decide(action=action, now=now, writes=writes)
    if decision is not None and decision.held is None:
        action.approve()
    return decision


def proposal_insert(action: Action, *, savepoint: bool) -> ProposalResult | None:
    """INSERT the proposal; None when it went in. A lost race on the UNIQUE action id returns
    the winner (same payload) or raises ProposalConflict, through a savepoint; without one it
    raises ProposalRaceLost (``answers_a_lost_proposal_race`` reads the winner after the
    transaction). Any other IntegrityError is raised as it is."""
    if not savepoint:
        try:
            action.save()
        except IntegrityError as lost:
            raise ProposalRaceLost(action) from lost
        return None
    try:
        # A savepoint, so that losing the race on the UNIQUE action id leaves the outer
        # transaction usable for reading the winner's row.
        with transaction.atomic():
            action.save()
    except IntegrityError:
        result = existing_proposal(action.action_id, action.payload, action.payload_hash)
        if result is None:
            raise  # not a race on the action id
        return result
    return None


def created_at_set_to_proposal_time(action: Action, *, now: datetime) -> None:
    """``auto_now_add`` stamps the clock, not the proposal's time: a proposal recorded with its
    own time (an import, the demo's history) would show "a minute ago" on its card and "2 days
    ago" in its trail. The card and the trail read the same time."""
    if abs(action.created_at - now) > timedelta(seconds=1):
        Action.objects.filter(pk=action.pk).update(created_at=now)
        action.created_at = now


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
