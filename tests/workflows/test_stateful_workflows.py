"""A Hypothesis state machine over workflows: random interleavings of proposals, approvals,
coordinator runs, worker dispatches (with crashes), lease sweeps, reconciliation, receiver
faults and finance's resolutions; invariants 12 to 16 checked after every step.

The companion of tests/actions/test_stateful_invariants.py (single refunds), with the same
approach: real services on a real database, an in-memory receiver per kind that counts every
effect per key (keys honoured where the kind's contract says so; the mail relay has none), a
simulated forward-only clock. Checked after every step:
- invariant 12: at most one effect per step key; a step's child exists only once the step
  before it is SUCCEEDED (or, for a read, its result saved);
- invariant 13: at most one effect per compensation key; a compensation exists only for a step
  whose child SUCCEEDED;
- invariant 14: a compensation is created only while no step of its workflow is unresolved,
  and compensations are created in reverse completion order;
- invariant 15: at most one live workflow per case; a different plan for it is refused;
- invariant 16: no email key (no keys, no lookup) has a second message without a person's
  recorded "send again" (the machine never records one, so: at most one).
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, note
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from actions.engine import reconcile as reconciliation
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import submission_send_and_record
from actions.engine.resolution_checks import ReviewRefused
from actions.engine.resolutions import action_resolve_failed, action_resolve_succeeded
from actions.engine.sweeps import sweep_expired_leases
from actions.foundation import clock
from actions.foundation.trail import Actor
from actions.kinds import kind_for
from actions.kinds.base import Outcome
from actions.kinds.fields import ProposalInvalid
from actions.models import (
    LIVE_WORKFLOW_STATES,
    Action,
    ActionStatus,
    Supplier,
    SupplierContact,
    Workflow,
    WorkflowStep,
)
from actions.workflows.coordinator import sweep_workflows, workflow_advance
from actions.workflows.services import PlanDecisionRefused, WorkflowConflict, plan_decide, workflow_propose
from actions.workflows.templates import READ
from tests.factories import make_agent, make_bill, make_order, make_request, make_user
from tests.workflows.conftest import ScriptedReceiver, po_parameters

S = ActionStatus
UNRESOLVED = {S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW}
MODES = [Outcome.SUCCEEDED] * 4 + [Outcome.FAILED_FINAL, Outcome.UNKNOWN, Outcome.NOT_SENT]
CRASHES = ["none", "none", "none", "after_claim", "after_answer"]
CLOCK = [datetime(2026, 1, 1, 9, 0, tzinfo=UTC)]
PEOPLE: dict[str, Any] = {}
# What the sequences reached, so the test fails if they never exercised the paths it guards.
STATS: dict[str, int] = {}
_numbers = itertools.count(1)


class WorkflowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.effects: list[tuple[str, str]] = []
        self.script: dict[str, Outcome] = {}
        self.fated: set[str] = set()  # keys whose receiver's answer the sequence fixed at its start
        self.receivers: dict[str, ScriptedReceiver] = {}
        self.bills: list[str] = []
        self.workflow_ids: list[str] = []
        # Compensations seen so far, per workflow, in the order they appeared.
        self.compensations: dict[str, list[str]] = {}

    def receiver(self, kind: str) -> ScriptedReceiver:
        if kind not in self.receivers:
            self.receivers[kind] = ScriptedReceiver(kind_for(kind).contract(), self.effects, self.script)
        return self.receivers[kind]

    def _children(self) -> list[Action]:
        return (
            list(Action.objects.filter(payload__workflow__in=self.workflow_ids).order_by("pk"))
            if self.workflow_ids
            else []
        )

    def _pick(self, index: int, *statuses: str) -> Action | None:
        candidates = [a for a in self._children() if a.status in statuses]
        return candidates[index % len(candidates)] if candidates else None

    # --- rules -------------------------------------------------------------------------------

    @initialize(amount=st.sampled_from(["10.00", "20.00", "35.00"]), email_refused=st.booleans())
    def an_approved_plan(self, amount: str, email_refused: bool) -> None:
        """Every sequence starts from an approved plan, so its steps are what gets explored; in
        half of them the relay refuses the supplier email for good, so compensation runs."""
        self.propose(True, amount)
        self.manager_approves()
        if email_refused and self.workflow_ids:
            key = f"{self.workflow_ids[0]}:email_supplier"
            self.script[key] = Outcome.FAILED_FINAL
            self.fated.add(key)

    @rule(new_bill=st.booleans(), amount=st.sampled_from(["10.00", "20.00", "35.00"]))
    def propose(self, new_bill: bool, amount: str) -> None:
        if (new_bill and len(self.bills) < 3) or not self.bills:
            bill = make_bill(number=f"SF-{next(_numbers)}", amount="200.00")
            self.bills.append(bill.number)
        number = self.bills[-1]
        try:
            result = workflow_propose(
                template="po_mismatch_resolution",
                parameters=po_parameters(bill_number=number, amount=amount),
                proposer=PEOPLE["agent"],
            )
        except WorkflowConflict as conflict:
            # Invariant 15: refused, naming the live workflow of the case (or the finished one
            # that already holds this workflow id).
            assert conflict.is_live == (conflict.live.state in LIVE_WORKFLOW_STATES)
            assert conflict.live.workflow_id in str(conflict)
            note(f"conflict with {conflict.live.workflow_id}")
            return
        except ProposalInvalid:
            return
        if result.workflow.workflow_id not in self.workflow_ids:
            self.workflow_ids.append(result.workflow.workflow_id)

    @rule()
    def manager_approves(self) -> None:
        for workflow in Workflow.objects.filter(workflow_id__in=self.workflow_ids, state="PROPOSED"):
            with contextlib.suppress(PlanDecisionRefused):
                plan_decide(workflow_pk=workflow.pk, user=PEOPLE["manager"], decision="approve")

    @rule()
    def coordinators_run(self) -> None:
        for workflow_id in self.workflow_ids:
            workflow_advance(workflow_id=workflow_id)

    @rule()
    def workflow_sweep_runs(self) -> None:
        sweep_workflows(now=CLOCK[0])

    @rule(
        modes=st.lists(st.sampled_from(MODES), min_size=1, max_size=4),
        crashes=st.lists(st.sampled_from(CRASHES), min_size=1, max_size=4),
    )
    def workers_dispatch(self, modes: list[Outcome], crashes: list[str]) -> None:
        """Every AUTHORIZED child is sent once, each with its receiver's answer and a crash."""
        for position, action in enumerate(a for a in self._children() if a.status == S.AUTHORIZED):
            mode, crash = modes[position % len(modes)], crashes[position % len(crashes)]
            if mode == Outcome.NOT_SENT and kind_for(action.kind).contract().honours_keys:
                # Only the mail relay proves "never handed over" (a 4xx before DATA); an API
                # receiver's early failure is an ambiguous one.
                mode = Outcome.UNKNOWN
            if action.idempotency_key not in self.fated:
                self.script[action.idempotency_key] = mode
            claim = submission_begin(action_pk=action.pk)
            if claim.outcome != ClaimOutcome.CLAIMED or crash == "after_claim":
                continue
            assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
            receiver = self.receiver(action.kind)
            if crash == "after_answer":
                receiver.send(claim.action)  # the receiver acted; the worker died before recording
                continue
            submission_send_and_record(
                action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token, receiver=receiver
            )

    @rule(
        modes=st.lists(st.sampled_from(MODES), min_size=1, max_size=4),
        crashes=st.lists(st.sampled_from(CRASHES), min_size=1, max_size=4),
    )
    def a_round_of_work(self, modes: list[Outcome], crashes: list[str]) -> None:
        """The coordinators, then the workers: what a healthy system does between two events
        (a separate rule from each of its parts, so that both orders are explored)."""
        self.coordinators_run()
        self.workers_dispatch(modes, crashes)

    @rule(seconds=st.sampled_from([1, 30, 120, 3600]))
    def time_passes(self, seconds: int) -> None:
        CLOCK[0] += timedelta(seconds=seconds)

    @rule()
    def lease_sweeper_runs(self) -> None:
        sweep_expired_leases(now=CLOCK[0])

    @rule()
    def reconciler_runs(self) -> None:
        for action in self._children():
            if action.status in (S.UNKNOWN, S.SETTLING):
                reconciliation.reconcile_action(action_pk=action.pk, receiver=self.receiver(action.kind), now=CLOCK[0])

    @rule(index=st.integers(0, 50))
    def finance_resolves(self, index: int) -> None:
        action = self._pick(index, S.NEEDS_REVIEW)
        if action is None or action.owner is None:
            return
        action.owner.refresh_from_db()
        happened = [ref for key, ref in self.effects if key == action.idempotency_key]
        with contextlib.suppress(ReviewRefused):
            if happened:
                action_resolve_succeeded(
                    action_pk=action.pk,
                    user=action.owner,
                    provider_reference=happened[0],
                    reason="The receiver's record shows it.",
                    evidence="machine ledger",
                    receiver=self.receiver(action.kind),
                )
            else:
                action_resolve_failed(
                    action_pk=action.pk,
                    user=action.owner,
                    reason="The receiver has nothing.",
                    receiver=self.receiver(action.kind),
                )

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def at_most_one_effect_per_key(self) -> None:
        """Invariants 12, 13 and 16: one effect per step key and per compensation key."""
        counts: dict[str, int] = {}
        for key, _ in self.effects:
            counts[key] = counts.get(key, 0) + 1
        assert all(count <= 1 for count in counts.values()), counts

    @invariant()
    def steps_in_order_and_compensations_only_for_succeeded_steps(self) -> None:
        """Invariants 12 and 13."""
        steps = WorkflowStep.objects.filter(workflow__workflow_id__in=self.workflow_ids).select_related(
            "action", "compensation"
        )
        by_workflow: dict[int, list[WorkflowStep]] = {}
        for step in steps:
            by_workflow.setdefault(step.workflow_id, []).append(step)
        for workflow_steps in by_workflow.values():
            workflow_steps.sort(key=lambda s: s.position)
            for earlier, later in itertools.pairwise(workflow_steps):
                if later.action is not None:
                    if earlier.kind == READ:
                        assert earlier.result is not None
                    else:
                        assert earlier.action is not None and earlier.action.status == S.SUCCEEDED
            for step in workflow_steps:
                if step.compensation is not None:
                    assert step.action is not None and step.action.status == S.SUCCEEDED

    @invariant()
    def compensations_in_reverse_and_never_while_unknown(self) -> None:
        """Invariant 14: a new compensation appears only while nothing is unresolved, and they
        appear in reverse completion order."""
        for workflow_id in self.workflow_ids:
            steps = list(
                WorkflowStep.objects.filter(workflow__workflow_id=workflow_id).select_related("action", "compensation")
            )
            seen = self.compensations.setdefault(workflow_id, [])
            current = sorted((s for s in steps if s.compensation is not None), key=lambda s: s.compensation.pk)  # type: ignore[union-attr]
            new = [s for s in current if s.name not in seen]
            if new:
                STATS["compensations"] = STATS.get("compensations", 0) + len(new)
                unresolved = [s.name for s in steps if s.action is not None and s.action.status in UNRESOLVED]
                assert not unresolved, f"compensation of {[s.name for s in new]} while {unresolved} unresolved"
                seen.extend(s.name for s in new)
            orders = [s.completion_order for s in current]
            assert orders == sorted(orders, reverse=True), orders  # type: ignore[type-var]

    @invariant()
    def one_live_workflow_per_case(self) -> None:
        """Invariant 15."""
        cases: dict[str, int] = {}
        for state in Workflow.objects.filter(workflow_id__in=self.workflow_ids).values_list("state", flat=True):
            STATS[state] = STATS.get(state, 0) + 1
        succeeded = sum(1 for child in self._children() if child.status == S.SUCCEEDED)
        STATS["children_succeeded"] = STATS.get("children_succeeded", 0) + succeeded
        for case in Workflow.objects.filter(state__in=sorted(LIVE_WORKFLOW_STATES)).values_list("case", flat=True):
            cases[case] = cases.get(case, 0) + 1
        assert all(count == 1 for count in cases.values()), cases


@pytest.mark.django_db(transaction=True)
def test_random_workflow_interleavings_never_break_invariants_12_to_16(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Invariants 12 to 16 hold after every step of 20 random sequences of 30 steps."""
    settings.ACCOUNTING_API_BASE = ""
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)
    monkeypatch.setattr("django.utils.timezone.now", lambda: CLOCK[0])
    # The engine reads the database's clock through this one: pin the offset, so that the
    # simulated clock is the engine's "now" too.
    monkeypatch.setattr(clock, "_offset", timedelta(0))
    monkeypatch.setattr(clock, "_measured_at", float("inf"))
    PEOPLE["manager"] = make_user("wf.manager", "manager", limits={"EUR": "1000"})
    make_user("wf.finance", "finance")
    make_user("wf.payable", "accounts payable")
    PEOPLE["agent"] = Actor.for_agent(make_agent(make_user("wf.owner", "agent"), name="wf-bot"))
    supplier = Supplier.objects.create(code="ACME", name="Acme Supplies")
    SupplierContact.objects.create(supplier=supplier, email="ap@acme.example")
    order = make_order(number="SF-ORDER", captured="100.00")
    make_request(order, 1)

    class Machine(WorkflowMachine):
        def __init__(self) -> None:
            CLOCK[0] += timedelta(days=1)
            super().__init__()

    run_state_machine_as_test(
        Machine,
        settings=hypothesis_settings(
            max_examples=20,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    # The sequences reached completion, pauses and compensation, not only the happy path.
    # (Complete runs, every step succeeding, are tests/workflows/test_coordinator.py's.)
    assert STATS.get("children_succeeded", 0) and STATS.get("PAUSED", 0) and STATS.get("compensations", 0), STATS
