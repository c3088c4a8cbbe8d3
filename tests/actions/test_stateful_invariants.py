"""A Hypothesis state machine over the services: random interleavings, every invariant checked.

No processes: the receiver is an in-memory fake that honours idempotency keys like Stripe and
can be told to time out after committing, fail before committing, reject, leave refunds
pending, or fail its lookups. Time is a simulated clock that only moves forward. Worker
crashes are modelled by stopping a submission after the claim or after the receiver answered.

After every step the machine checks, over its own orders and actions:
- invariant 1: at most one effect per action at the receiver;
- invariant 2: every SUCCEEDED action has exactly one succeeded effect, its reference recorded;
- invariant 3: the receiver was only ever called for an action committed as SUBMITTING;
- invariant 4: action id, idempotency key and payload hash never change;
- invariant 5: refunded = sum of SUCCEEDED, reserved = sum of live amounts, within captured;
- invariant 6: no submission under an expired approval or one bound to other values;
- invariant 9: the audit trail is a chain ending in the current status.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import F
from hypothesis import HealthCheck, note
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from actions.engine import reconcile as reconciliation
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.record import submission_record
from actions.engine.send import receiver_send
from actions.engine.sweeps import sweep_expired_leases
from actions.foundation import clock
from actions.kinds.fields import ProposalInvalid
from actions.kinds.refund.contract import RefundReceiver
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Order
from actions.models.actions import RESERVING_STATUSES
from actions.providers.base import (
    AmbiguousError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
)
from actions.services import Actor, ProposalConflict
from approvals.models import Approval, Decision
from approvals.services import DecisionRefused, approval_decide
from tests.factories import make_agent, make_order, make_request, make_user

S = ActionStatus
MODES = ["ok", "commit_then_timeout", "commit_then_500", "fail_before_commit", "reject", "pending", "rate_limit"]
_ids = itertools.count(1)
# Operations with weights (repeats): execution and reconciliation are where the bugs would be.
OPERATIONS = [
    *["propose"] * 3,
    "propose_again",
    *["approve"] * 2,
    "order_changes",
    "time_passes",
    *["dispatch"] * 5,
    *["sweep_leases"] * 2,
    *["reconcile"] * 4,
    *["settle"] * 2,
]


@dataclass
class FakeReceiver:
    """A Stripe-like receiver in memory: keys replay, refunds can be pending, faults on demand."""

    clock: Any
    mode: str = "ok"
    lookups_down: bool = False
    refunds: list[ProviderRefund] = field(default_factory=list)
    keys: dict[str, tuple[tuple[Any, ...], ProviderRefund]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    name: str = "fake"
    guarantees: ProviderGuarantees = field(
        default_factory=lambda: ProviderGuarantees(
            honours_idempotency_keys=True,
            key_retention=timedelta(hours=24),
            supports_lookup=True,
            lookup_authoritative=True,
            lookup_visibility_delay=timedelta(seconds=0),
        )
    )

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        # Invariant 3: the receiver is only called for a committed SUBMITTING row.
        status = Action.objects.filter(action_id=req.action_id).values_list("status", flat=True).first()
        if status != S.SUBMITTING:
            self.violations.append(f"receiver called for {req.action_id} while it is {status}")
        params = (req.charge, req.amount_minor, req.currency)
        if req.idempotency_key in self.keys:
            stored_params, refund = self.keys[req.idempotency_key]
            if stored_params != params:
                raise IdempotencyMismatchError("keys reused with other parameters", code="idempotency_error")
            return self._current(refund.id)
        mode = self.mode
        if mode == "fail_before_commit":
            raise AmbiguousError("500 before commit", http_status=500)
        if mode == "rate_limit":
            raise AmbiguousError("rate limited", http_status=429)
        if mode == "reject":
            raise DefinitiveError("invalid amount", code="parameter_invalid_integer", http_status=400)
        refund = ProviderRefund(
            id=f"re_fake_{next(_ids)}",
            charge=req.charge,
            amount_minor=req.amount_minor,
            currency=req.currency,
            status=RefundStatus.PENDING if mode == "pending" else RefundStatus.SUCCEEDED,
            metadata=dict(req.metadata),
            created=int(self.clock().timestamp()),
            raw={"object": "refund"},
        )
        self.refunds.append(refund)
        self.keys[req.idempotency_key] = (params, refund)
        if mode == "commit_then_timeout":
            raise AmbiguousError("timed out after commit")
        if mode == "commit_then_500":
            raise AmbiguousError("500 after commit", http_status=500)
        return refund

    def _current(self, refund_id: str) -> ProviderRefund:
        return next(r for r in self.refunds if r.id == refund_id)

    def get_refund(self, refund_id: str) -> ProviderRefund:
        if self.lookups_down:
            raise LookupFailed("lookup down")
        for refund in self.refunds:
            if refund.id == refund_id:
                return refund
        raise NotFoundError("no such refund", http_status=404)

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        if self.lookups_down:
            raise LookupFailed("lookup down")
        return [r for r in self.refunds if r.charge == charge and (action_id is None or r.action_id == action_id)]

    def iter_ledger(self, *, created_from: int | None = None, created_before: int | None = None) -> Any:
        return iter(list(self.refunds))

    def settle(self, index: int, succeeded: bool) -> None:
        pending = [i for i, r in enumerate(self.refunds) if r.status == RefundStatus.PENDING]
        if not pending:
            return
        i = pending[index % len(pending)]
        old = self.refunds[i]
        self.refunds[i] = ProviderRefund(
            id=old.id,
            charge=old.charge,
            amount_minor=old.amount_minor,
            currency=old.currency,
            status=RefundStatus.SUCCEEDED if succeeded else RefundStatus.FAILED,
            metadata=old.metadata,
            created=old.created,
            raw=old.raw,
        )


class ServicesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.receiver = FakeReceiver(clock=lambda: self.now)
        self.orders = [make_order(captured="100.00", paid_at=self.now - timedelta(days=1)) for _ in range(2)]
        self.material: dict[int, tuple[str, str, str]] = {}

    # --- helpers ---------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        return CLOCK[0]

    @now.setter
    def now(self, value: datetime) -> None:
        CLOCK[0] = value

    def _actions(self) -> list[Action]:
        return list(Action.objects.filter(order__in=self.orders).order_by("pk"))

    def _has(self, *statuses: str) -> bool:
        return Action.objects.filter(order__in=self.orders, status__in=statuses).exists()

    def _pick(self, index: int, *statuses: str) -> Action | None:
        candidates = [a for a in self._actions() if a.status in statuses]
        return candidates[index % len(candidates)] if candidates else None

    # --- the one rule ----------------------------------------------------------------------

    @rule(
        operation=st.sampled_from(OPERATIONS),
        index=st.integers(0, 50),
        order=st.integers(0, 1),
        amount=st.sampled_from(["5.00", "20.00", "30.00", "45.00", "70.00"]),
        mode=st.sampled_from(MODES),
        crash=st.sampled_from(["none", "none", "after_claim", "after_answer"]),
        seconds=st.sampled_from([1, 30, 600, 3600 * 25]),
        flag=st.booleans(),
    )
    def step(
        self, operation: str, index: int, order: int, amount: str, mode: str, crash: str, seconds: int, flag: bool
    ) -> None:
        """One step. A single rule drawing a weighted operation keeps the mix realistic: left to
        choose among many rules, Hypothesis spends most steps proposing and rarely executes."""
        note(f"{operation} index={index} order={order} amount={amount} mode={mode} crash={crash}")
        if operation == "propose":
            self.propose(order, amount)
        elif operation == "propose_again":
            self.propose_the_same_request_again(index)
        elif operation == "approve":
            self.manager_approves(index)
        elif operation == "order_changes":
            self.order_changes_elsewhere(order)
        elif operation == "time_passes":
            self.time_passes(seconds)
        elif operation == "dispatch":
            self.worker_dispatches(index, mode, crash)
        elif operation == "sweep_leases":
            self.lease_sweeper_runs()
        elif operation == "reconcile":
            self.reconciler_runs(index, mode, flag)
        elif operation == "settle":
            self.receiver_settles_a_pending_refund(index, flag)

    # --- operations ------------------------------------------------------------------------

    def propose(self, order: int, amount: str) -> None:
        target = self.orders[order]
        request = make_request(target)
        # Over the refundable balance the proposal is refused and nothing is written.
        with contextlib.suppress(ProposalInvalid):
            action_propose_refund(
                order_number=target.number,
                request_number=request.number,
                amount=amount,
                currency="EUR",
                reason_code="damaged",
                proposer=AGENT_ACTOR[0],
                now=self.now,
            )

    def propose_the_same_request_again(self, index: int) -> None:
        actions = self._actions()
        if not actions:
            return
        existing = actions[index % len(actions)]
        try:
            result = action_propose_refund(
                order_number=existing.payload["order"],
                request_number=existing.payload["request"],
                amount=existing.payload["amount"],
                currency="EUR",
                reason_code=existing.reason_code,
                proposer=AGENT_ACTOR[0],
                now=self.now,
            )
        except (ProposalInvalid, ProposalConflict) as error:
            raise AssertionError(f"an identical proposal must return the existing action: {error}") from error
        assert result.action.pk == existing.pk and not result.created

    def manager_approves(self, index: int) -> None:
        action = self._pick(index, S.PROPOSED)
        if action is not None:
            with contextlib.suppress(DecisionRefused):
                approval_decide(action_pk=action.pk, user=MANAGER[0], decision=Decision.APPROVE, now=self.now)

    def order_changes_elsewhere(self, order: int) -> None:
        # A correction or another system changed the order: every approval bound to the old
        # version must go stale at reservation.
        Order.objects.filter(pk=self.orders[order].pk).update(version=F("version") + 1)

    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    def worker_dispatches(self, index: int, mode: str, crash: str) -> None:
        action = self._pick(index, S.AUTHORIZED)
        if action is None:
            return
        self.receiver.mode = mode
        claim = submission_begin(action_pk=action.pk, now=self.now)
        if claim.outcome != ClaimOutcome.CLAIMED or crash == "after_claim":
            return
        assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
        answer = receiver_send(action=claim.action, receiver=RefundReceiver(self.receiver))
        if crash == "after_answer":
            return
        submission_record(
            action_pk=action.pk, attempt_pk=claim.attempt.pk, lease_token=claim.lease_token, answer=answer
        )

    def lease_sweeper_runs(self) -> None:
        sweep_expired_leases(now=self.now)

    def reconciler_runs(self, index: int, mode: str, lookups_down: bool) -> None:
        action = self._pick(index, S.UNKNOWN, S.SETTLING)
        if action is None:
            return
        self.receiver.mode = mode
        self.receiver.lookups_down = lookups_down
        reconciliation.reconcile_action(action_pk=action.pk, receiver=RefundReceiver(self.receiver), now=self.now)
        self.receiver.lookups_down = False

    def receiver_settles_a_pending_refund(self, index: int, succeeded: bool) -> None:
        self.receiver.settle(index, succeeded)

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def receiver_was_only_called_under_a_lease(self) -> None:
        assert not self.receiver.violations, self.receiver.violations

    @invariant()
    def effects_match_actions(self) -> None:
        for action in self._actions():
            effects = [
                r for r in self.receiver.refunds if r.action_id == action.action_id and r.status != RefundStatus.FAILED
            ]
            assert len(effects) <= 1, f"invariant 1: {action.action_id} has {len(effects)} effects"
            if action.status == S.SUCCEEDED:
                succeeded = [e for e in effects if e.status == RefundStatus.SUCCEEDED]
                assert len(succeeded) == 1, f"invariant 2: {action.action_id} SUCCEEDED without one effect"
                assert action.provider_reference == succeeded[0].id

    @invariant()
    def material_never_changes(self) -> None:
        for action in self._actions():
            fingerprint = (action.action_id, action.idempotency_key, action.payload_hash)
            assert self.material.setdefault(action.pk, fingerprint) == fingerprint, "invariant 4"

    @invariant()
    def money_adds_up(self) -> None:
        for order in Order.objects.filter(pk__in=[o.pk for o in self.orders]):
            actions = list(order.actions.all())
            refunded = sum((a.amount for a in actions if a.status == S.SUCCEEDED), Decimal("0"))
            reserved = sum((a.amount for a in actions if a.status in RESERVING_STATUSES), Decimal("0"))
            assert order.refunded_amount == refunded, f"invariant 5: refunded {order.refunded_amount} != {refunded}"
            assert order.reserved_amount == reserved, f"invariant 5: reserved {order.reserved_amount} != {reserved}"
            assert refunded + reserved <= order.captured_amount

    @invariant()
    def submissions_respect_their_approval(self) -> None:
        for event in ActionEvent.objects.filter(action__order__in=self.orders, transition="begin_submission"):
            approval = (
                Approval.objects.filter(
                    action_id=event.action_id, decision=Decision.APPROVE, decided_at__lte=event.created_at
                )
                .order_by("-decided_at", "-pk")
                .first()
            )
            assert approval is not None, "invariant 6: a submission without an approval"
            assert approval.expires_at is not None and approval.expires_at > event.created_at, "invariant 6: expired"
            action = event.action
            assert (approval.amount, approval.currency, approval.payload_hash) == (
                action.amount,
                action.currency,
                action.payload_hash,
            ), "invariant 6: binding differs"

    @invariant()
    def audit_trail_is_a_chain(self) -> None:
        for action in self._actions():
            events = list(action.events.order_by("created_at", "pk").values_list("from_state", "to_state"))
            assert events, "invariant 9: an action without events"
            assert events[0][0] == ""
            for (_, previous_to), (next_from, _) in itertools.pairwise(events):
                assert next_from == previous_to, f"invariant 9: broken chain {events}"
            assert events[-1][1] == action.status, f"invariant 9: trail ends in {events[-1][1]}, status {action.status}"


BASE_TIME = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
# The simulated clock: django.utils.timezone.now reads it during the test, so every service
# sees the machine's time, and time only moves forward within one sequence.
CLOCK: list[datetime] = [BASE_TIME]
MANAGER: list[Any] = []
AGENT_ACTOR: list[Actor] = []


# transaction=True: the services commit for real, and the provider call asserts that no
# transaction is open around it, as in production.
@pytest.mark.django_db(transaction=True)
def test_random_interleavings_never_break_an_invariant(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Invariants 1, 2, 3, 4, 5, 6 and 9 hold after every step of 40 random sequences of 40 steps.

    Raise max_examples locally to explore more; CI keeps the run short and deterministic.
    """
    settings.AUTO_APPROVAL_ENABLED = True
    settings.REFUND_WINDOW_DAYS = 3650
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    # The clock is the machine's: services that read the time get the simulated one. Each
    # sequence starts a day after the previous one ended, so time never runs backwards.
    monkeypatch.setattr("django.utils.timezone.now", lambda: CLOCK[0])
    # The engine reads the database's clock through this one: pin the offset, so that the
    # simulated clock is the engine's "now" too.
    monkeypatch.setattr(clock, "_offset", timedelta(0))
    monkeypatch.setattr(clock, "_measured_at", float("inf"))
    MANAGER[:] = [make_user("stateful.manager", "manager", limits={"EUR": "1000"})]
    make_user("stateful.finance", "finance")
    AGENT_ACTOR[:] = [Actor.for_agent(make_agent(make_user("stateful.owner", "agent"), name="stateful-bot"))]

    class Machine(ServicesMachine):
        def __init__(self) -> None:
            CLOCK[0] += timedelta(days=1)
            super().__init__()

    run_state_machine_as_test(
        Machine,
        settings=hypothesis_settings(
            # Mutation runs (tests/mutation_subset.py) lower it: this test reaches most of the
            # engine, so every surviving mutant pays for all of its examples.
            max_examples=int(os.environ.get("STATEFUL_MAX_EXAMPLES", "40")),
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
