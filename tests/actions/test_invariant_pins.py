"""The invariant checker's verdicts pinned (``actions.engine.invariants``).

``check_effects`` is what ``manage.py audit_effects``, the chaos runs and the crash matrices
trust to say "0 duplicates, 0 lost". Its tests elsewhere assert that a violation is found; the
mutants that survived them changed *how much* is counted (two lost of one kind counted as one),
*what* is said (a message's words), or *where the line is* (a bound moved by a microsecond). Each
test here gives the checker a small, exact picture (docs/architecture.md section 8, invariants 1, 2 and 8)
and pins every number and every word of its report.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from actions.engine.invariants import EffectsReport, check_effects, decider_limits_by_user, max_unknown_seconds
from actions.foundation.trail import RESEND_TRANSITION, event_record
from actions.kinds import all_kinds, kind_for
from actions.kinds.base import Outcome
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import (
    Action,
    ActionStatus,
    OutsideRefund,
    Workflow,
    WorkflowStep,
)
from actions.models.actions import ActorKind
from actions.models.workflows import WorkflowState
from actions.services import Actor
from approvals.models import Approval, ApprovalPolicy, Decision
from tests.actions.test_audit_effects import effect
from tests.actions.test_reconciliation import authorized_refund
from tests.factories import make_order, make_request, make_user
from tests.mail import BILL_PARAMETERS, supplier  # noqa: F401 -- a fixture

pytestmark = pytest.mark.django_db

S = ActionStatus
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


@pytest.fixture
def bounds(settings: Any) -> Any:
    """Small, exact bounds: a lease of 60 s, a sweep every 30 s, and an escalation policy whose
    worst case is 3 x (5 + 30 + 60) + 1.25 x (10 + 20 + 40) = 372.5 s."""
    settings.LEASE_SECONDS, settings.SWEEP_INTERVAL_SECONDS = 60, 30
    settings.RECONCILE_MAX_FAILURES, settings.RECONCILE_BASE_BACKOFF_SECONDS = 2, 10
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 5
    return settings


def set_row(action: Action, **fields: Any) -> Action:
    Action.objects.filter(pk=action.pk).update(**fields)
    return Action.objects.get(pk=action.pk)


def found(report: EffectsReport, *invariants: int) -> list[tuple[int, str, str]]:
    """The violations of these invariants, in a stable order (actions are read in no order)."""
    return sorted((v.invariant, v.subject, v.message) for v in report.violations if v.invariant in invariants)


def per_kind(**counts: int) -> dict[str, int]:
    """A per-kind counter as the report keeps it: every kind present, at 0 unless given."""
    return {kind.name: 0 for kind in all_kinds()} | counts


def resend_decision(action: Action) -> None:
    """A person's recorded "send again" (invariant 16): it allows one more effect."""
    # Through the trail's writer, which links each event into its action's hash chain.
    event_record(
        action=action,
        transition=RESEND_TRANSITION,
        from_state=S.NEEDS_REVIEW,
        to_state=S.AUTHORIZED,
        actor=Actor(kind=ActorKind.USER, label="fiona.finance"),
    )


# -- the escalation policy's bound ---------------------------------------------------------------


def test_the_longest_an_action_may_stay_unknown_is_the_reconcilers_worst_schedule(bounds: Any) -> None:
    assert max_unknown_seconds() == 372.5


def test_the_backoff_in_the_longest_unknown_stops_doubling_after_six_failures(settings: Any) -> None:
    """Nine passes, each waiting 1.25 x the backoff and nothing else: 1, 2, 4 ... 64, then 64, 64."""
    settings.RECONCILE_MAX_FAILURES, settings.RECONCILE_BASE_BACKOFF_SECONDS = 8, 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = settings.SWEEP_INTERVAL_SECONDS = settings.LEASE_SECONDS = 0
    assert max_unknown_seconds() == 1.25 * (1 + 2 + 4 + 8 + 16 + 32 + 64 + 64 + 64)


# -- invariant 8: lost, counted one by one --------------------------------------------------------


def test_three_lost_refunds_are_three_lost_under_their_kind_each_with_its_reason(
    agent_actor: Actor, bounds: Any
) -> None:
    stuck, forgotten, orphaned = (authorized_refund(agent_actor) for _ in range(3))
    set_row(stuck, status=S.SUBMITTING, status_changed_at=NOW - timedelta(minutes=3), lease_expires_at=NOW)
    set_row(forgotten, status=S.UNKNOWN, status_changed_at=NOW - timedelta(hours=3), next_reconcile_at=NOW)
    set_row(orphaned, status=S.NEEDS_REVIEW, owner=None)

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == sorted(
        [
            (8, stuck.action_id, "SUBMITTING for 3 min, beyond lease + sweep interval"),
            (8, forgotten.action_id, "UNKNOWN for 3 h, beyond the escalation policy"),
            (8, orphaned.action_id, "NEEDS_REVIEW with no named owner"),
        ]
    )
    assert (report.lost, report.lost_by_kind) == (3, per_kind(refund=3))
    assert report.duplicates_by_kind == per_kind()


def test_lost_and_duplicated_actions_of_a_kind_no_longer_registered_are_counted_under_its_own_name(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows outlive code: a kind retired from the registry still has its actions in the table
    (a row's kind cannot change), and the audit must count them, one by one, not stop (or count
    them as one) because the kind is not among those it set to zero."""
    first, second, twice = (authorized_refund(agent_actor) for _ in range(3))
    for action in (first, second):
        set_row(action, status=S.NEEDS_REVIEW, owner=None)
    registered = [kind for kind in all_kinds() if kind.name != "refund"]
    monkeypatch.setattr("actions.engine.invariants.all_kinds", lambda: registered)
    ledger = [effect("re_a", twice.action_id), effect("re_b", twice.action_id), effect("re_c", twice.action_id)]

    report = check_effects(ledger=ledger, now=NOW)

    zero = {kind.name: 0 for kind in registered}
    assert (report.lost, report.lost_by_kind) == (2, zero | {"refund": 2})
    assert (report.duplicates, report.duplicates_by_kind) == (2, zero | {"refund": 2})
    assert found(report, 8) == sorted(
        [
            (8, first.action_id, "NEEDS_REVIEW with no named owner"),
            (8, second.action_id, "NEEDS_REVIEW with no named owner"),
        ]
    )


def test_live_actions_of_a_kind_no_longer_registered_with_nothing_due_are_lost_under_its_own_name(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the liveness check: actions with no due time, of a kind the audit did not
    set to zero, counted one by one."""
    leaseless, unscheduled = (authorized_refund(agent_actor) for _ in range(2))
    set_row(leaseless, status=S.SUBMITTING, lease_expires_at=None, status_changed_at=NOW)
    set_row(unscheduled, status=S.UNKNOWN, next_reconcile_at=None, status_changed_at=NOW)
    registered = [kind for kind in all_kinds() if kind.name != "refund"]
    monkeypatch.setattr("actions.engine.invariants.all_kinds", lambda: registered)

    report = check_effects(ledger=[], now=NOW)

    assert (report.lost, report.lost_by_kind) == (2, {kind.name: 0 for kind in registered} | {"refund": 2})
    assert found(report, 8) == sorted(
        [
            (8, leaseless.action_id, "SUBMITTING without a lease expiry: the lease sweep would never move it on"),
            (
                8,
                unscheduled.action_id,
                "UNKNOWN with no reconciliation due: the reconciliation sweep would never pick it",
            ),
        ]
    )


def test_a_submission_is_lost_only_a_microsecond_after_its_lease_and_a_sweep(agent_actor: Actor, bounds: Any) -> None:
    on_the_line, past_it = authorized_refund(agent_actor), authorized_refund(agent_actor)
    bound = timedelta(seconds=60 + 30)
    set_row(on_the_line, status=S.SUBMITTING, status_changed_at=NOW - bound, lease_expires_at=NOW)
    set_row(
        past_it, status=S.SUBMITTING, status_changed_at=NOW - bound - timedelta(microseconds=1), lease_expires_at=NOW
    )

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == [(8, past_it.action_id, "SUBMITTING for 90 s, beyond lease + sweep interval")]
    # The grace asked for moves the line by exactly that much.
    assert found(check_effects(ledger=[], now=NOW, stuck_grace_seconds=0.000001), 8) == []


def test_an_unknown_is_lost_only_a_microsecond_after_the_escalation_policys_bound(
    agent_actor: Actor, bounds: Any
) -> None:
    on_the_line, past_it = authorized_refund(agent_actor), authorized_refund(agent_actor)
    bound = timedelta(seconds=372.5)
    set_row(on_the_line, status=S.UNKNOWN, status_changed_at=NOW - bound, next_reconcile_at=NOW)
    set_row(past_it, status=S.UNKNOWN, status_changed_at=NOW - bound - timedelta(microseconds=1), next_reconcile_at=NOW)

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == [(8, past_it.action_id, "UNKNOWN for 6 min, beyond the escalation policy")]
    assert found(check_effects(ledger=[], now=NOW, stuck_grace_seconds=0.000001), 8) == []


def test_a_row_without_a_status_change_time_is_as_old_as_the_check(agent_actor: Actor, bounds: Any) -> None:
    action = authorized_refund(agent_actor)
    set_row(action, status=S.SUBMITTING, status_changed_at=None, lease_expires_at=NOW)
    assert check_effects(ledger=[], now=NOW).lost == 0


def test_a_submission_an_unknown_and_a_review_within_their_bounds_are_not_lost(
    agent_actor: Actor, bounds: Any, manager: Any
) -> None:
    """A SUBMITTING row as old as the UNKNOWN bound is still lost (its own bound is the lease's),
    an UNKNOWN as old as the lease bound is not, and a NEEDS_REVIEW with an owner is owned."""
    submitting, unknown, review = (authorized_refund(agent_actor) for _ in range(3))
    set_row(submitting, status=S.SUBMITTING, status_changed_at=NOW - timedelta(seconds=300), lease_expires_at=NOW)
    set_row(unknown, status=S.UNKNOWN, status_changed_at=NOW - timedelta(seconds=300), next_reconcile_at=NOW)
    set_row(review, status=S.NEEDS_REVIEW, owner=manager, status_changed_at=NOW - timedelta(days=30))

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == [(8, submitting.action_id, "SUBMITTING for 5 min, beyond lease + sweep interval")]
    assert report.lost == 1


# -- invariant 1: duplicates, repeats a person decided, explained outside refunds -------------


def test_duplicates_are_counted_per_extra_effect_and_per_kind_and_named_in_order(agent_actor: Actor) -> None:
    thrice, twice = authorized_refund(agent_actor), authorized_refund(agent_actor)
    ledger = [
        effect("re_c", thrice.action_id),
        effect("re_a", thrice.action_id),
        effect("re_b", thrice.action_id),
        effect("re_y", twice.action_id),
        effect("re_x", twice.action_id, Outcome.PENDING),  # pending is an effect too
        effect("re_refused", twice.action_id, Outcome.FAILED_FINAL),  # refused is none
    ]

    report = check_effects(ledger=ledger, now=NOW)

    assert found(report, 1) == sorted(
        [
            (1, thrice.action_id, "3 effects at the receiver: re_a, re_b, re_c"),
            (1, twice.action_id, "2 effects at the receiver: re_x, re_y"),
        ]
    )
    assert (report.effects, report.duplicates, report.duplicates_by_kind) == (5, 3, per_kind(refund=3))
    assert report.repeats_by_decision == 0


def test_an_extra_effect_a_person_decided_is_a_repeat_and_one_more_is_a_duplicate(agent_actor: Actor) -> None:
    resent_once, resent_once_but_thrice, resent_twice = (authorized_refund(agent_actor) for _ in range(3))
    for action in (resent_once, resent_once_but_thrice, resent_twice, resent_twice):
        resend_decision(action)
    ledger = [
        effect("re_1a", resent_once.action_id),
        effect("re_1b", resent_once.action_id),
        effect("re_2a", resent_once_but_thrice.action_id),
        effect("re_2b", resent_once_but_thrice.action_id),
        effect("re_2c", resent_once_but_thrice.action_id),
        effect("re_3a", resent_twice.action_id),
        effect("re_3b", resent_twice.action_id),
        effect("re_3c", resent_twice.action_id),
    ]

    report = check_effects(ledger=ledger, now=NOW)

    assert report.repeats_by_decision == 1 + 2
    assert found(report, 1) == [(1, resent_once_but_thrice.action_id, "3 effects at the receiver: re_2a, re_2b, re_2c")]
    assert (report.duplicates, report.duplicates_by_kind) == (2, per_kind(refund=2))


def test_outside_refunds_booked_on_their_order_are_explained_and_an_unbooked_one_is_not() -> None:
    order = make_order(captured="100.00")
    for reference, booked in (("re_out_1", True), ("re_out_2", True), ("re_out_failed", False)):
        OutsideRefund.objects.create(
            order=order,
            reference=reference,
            amount=Decimal("1.00"),
            currency="EUR",
            status="succeeded" if booked else "failed",
            booked=booked,
            event_id=f"evt_{reference}",
            created_at=NOW,
            updated_at=NOW,
        )

    report = check_effects(
        ledger=[effect("re_out_1", None), effect("re_out_2", None), effect("re_out_failed", None)], now=NOW
    )

    assert report.explained == 2
    assert found(report, 1) == [(1, "re_out_failed", "effect re_out_failed names no known action (no action id)")]


# -- invariant 2: a success has exactly one effect, and it is the one recorded -------------------


def test_a_success_with_no_effect_or_two_or_only_a_pending_one_is_reported(agent_actor: Actor) -> None:
    none, two, pending = (authorized_refund(agent_actor) for _ in range(3))
    for action in (none, two, pending):
        set_row(action, status=S.SUCCEEDED, provider_reference=f"re_{action.pk}")
    ledger = [
        effect(f"re_{two.pk}", two.action_id),
        effect("re_second", two.action_id),
        effect(f"re_{pending.pk}", pending.action_id, Outcome.PENDING),
    ]

    report = check_effects(ledger=ledger, now=NOW)

    assert found(report, 2) == sorted(
        [
            (2, none.action_id, "SUCCEEDED with 0 succeeded effects at the receiver"),
            (2, two.action_id, "SUCCEEDED with 2 succeeded effects at the receiver"),
            (2, pending.action_id, "SUCCEEDED with 0 succeeded effects at the receiver"),
        ]
    )


def test_a_second_success_a_person_decided_is_allowed_for_a_succeeded_action(agent_actor: Actor) -> None:
    action = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_second")
    resend_decision(action)

    report = check_effects(ledger=[effect("re_first", action.action_id), effect("re_second", action.action_id)])

    assert found(report, 1, 2) == []
    assert report.repeats_by_decision == 1


def test_a_success_whose_recorded_reference_is_not_its_effect_is_reported_with_both(agent_actor: Actor) -> None:
    wrong = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_recorded")
    blank = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="")
    right = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_right")

    report = check_effects(
        ledger=[
            effect("re_at_receiver", wrong.action_id),
            effect("re_blank", blank.action_id),
            effect("re_right", right.action_id),
        ],
        now=NOW,
    )

    assert found(report, 1, 2) == sorted(
        [
            (2, wrong.action_id, "recorded reference re_recorded but the effect is re_at_receiver"),
            (2, blank.action_id, "recorded reference (none) but the effect is re_blank"),
        ]
    )


def test_a_success_of_a_kind_whose_ledger_is_not_read_is_not_counted(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment without a kind's receiver (no accounting system) has no ledger to count in."""
    action = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_1")
    assert found(check_effects(ledger=[], now=NOW), 2) == [
        (2, action.action_id, "SUCCEEDED with 0 succeeded effects at the receiver")
    ]

    monkeypatch.setattr(type(kind_for("refund")), "ledger_enabled", lambda self: False)
    assert found(check_effects(ledger=[], now=NOW), 2) == []


def test_a_success_that_failed_nowhere_else_is_checked_only_once_it_succeeded(agent_actor: Actor) -> None:
    """Invariant 2 is about SUCCEEDED rows: a SETTLING one with no effect yet is not reported."""
    action = set_row(authorized_refund(agent_actor), status=S.SETTLING, next_reconcile_at=NOW)
    assert found(check_effects(ledger=[], now=NOW), 2) == []
    assert action.status == S.SETTLING


def _compensated_step(step_action: Action, compensation: Action) -> None:
    workflow = Workflow.objects.create(
        workflow_id=f"wf-{step_action.pk}",
        template="bill_mismatch",
        case=f"case-{step_action.pk}",
        parameters={},
        plan={},
        plan_hash="h",
        state=WorkflowState.COMPENSATING,
    )
    WorkflowStep.objects.create(
        workflow=workflow, position=1, name="refund", kind="refund", step_class="effect",
        action=step_action, compensation_kind="refund", compensation=compensation,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("compensation_status", "explained"),
    [
        (S.SUCCEEDED, True),
        (S.SUBMITTING, True),
        (S.UNKNOWN, True),
        (S.SETTLING, True),
        (S.NEEDS_REVIEW, True),
        (S.FAILED_FINAL, False),
        (S.AUTHORIZED, False),
    ],
)
def test_a_success_walked_back_by_a_compensation_sent_or_being_established_needs_no_effect(
    agent_actor: Actor, compensation_status: str, explained: bool
) -> None:
    step = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_voided")
    _compensated_step(step, set_row(authorized_refund(agent_actor), status=compensation_status))

    # (The compensation is a refund here too: only the step's own verdict is the point.)
    violations = [v for v in found(check_effects(ledger=[], now=NOW), 2) if v[1] == step.action_id]

    assert violations == (
        [] if explained else [(2, step.action_id, "SUCCEEDED with 0 succeeded effects at the receiver")]
    )


def test_a_compensated_success_whose_effect_is_still_there_is_still_checked(agent_actor: Actor) -> None:
    step = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_recorded")
    _compensated_step(step, set_row(authorized_refund(agent_actor), status=S.SUCCEEDED))

    report = check_effects(ledger=[effect("re_other", step.action_id)], now=NOW)

    assert [v for v in found(report, 2) if v[1] == step.action_id] == [
        (2, step.action_id, "recorded reference re_recorded but the effect is re_other")
    ]


def test_a_walked_back_success_ends_only_its_own_check_not_the_others(agent_actor: Actor) -> None:
    """Successes with no effect on both sides of a walked-back one (actions are read newest
    first): each is still reported; the compensated one is skipped, and only it."""
    before = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_before")
    step = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_voided")
    _compensated_step(step, set_row(authorized_refund(agent_actor), status=S.SUCCEEDED))
    after = set_row(authorized_refund(agent_actor), status=S.SUCCEEDED, provider_reference="re_after")

    report = check_effects(ledger=[], now=NOW)

    unexplained = "SUCCEEDED with 0 succeeded effects at the receiver"
    assert [
        v for v in found(report, 2) if v[1] != step.action_id and v[1] in (before.action_id, after.action_id)
    ] == sorted([(2, before.action_id, unexplained), (2, after.action_id, unexplained)])
    assert [v for v in found(report, 2) if v[1] == step.action_id] == []


def test_each_kinds_money_check_is_added_up_and_reported_as_invariant_5(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit asks every kind for its targets' money (orders, bills): it adds up how many
    were checked and reports each kind's problem under invariant 5, word for word."""
    answers = {
        "refund": (2, [("order-1001", "refunded 5.00 but SUCCEEDED refunds sum to 0")]),
        "invoice-adjustment": (3, [("bill-7", "reserved 1.00 but live adjustments sum to 0")]),
    }
    for kind in all_kinds():
        monkeypatch.setattr(kind, "money_violations", lambda name=kind.name: answers.get(name, (0, [])))

    report = check_effects(ledger=[], now=NOW)

    assert report.targets == 2 + 3
    assert found(report, 5, 6) == [
        (5, "bill-7", "reserved 1.00 but live adjustments sum to 0"),
        (5, "order-1001", "refunded 5.00 but SUCCEEDED refunds sum to 0"),
    ]


@pytest.mark.parametrize("status", [S.FAILED_FINAL, S.REJECTED, S.CANCELLED])
def test_a_final_non_success_with_a_succeeded_effect_means_money_moved_without_a_record(
    agent_actor: Actor, status: str
) -> None:
    action = set_row(authorized_refund(agent_actor), status=status)
    quiet = set_row(authorized_refund(agent_actor), status=status)

    report = check_effects(
        ledger=[effect("re_moved", action.action_id), effect("re_pending", quiet.action_id, Outcome.PENDING)], now=NOW
    )

    assert found(report, 1) == [
        (1, action.action_id, f"{status} in the console but a succeeded effect at the receiver")
    ]


# -- invariant 8, liveness: every live action has a due time, a next step or a person --------------


def propose(actor: Actor, amount: str, currency: str = "EUR") -> Action:
    order = make_order(captured="1000.00", currency=currency)
    return action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount=amount,
        currency=currency,
        reason_code="damaged",
        proposer=actor,
    ).action


def test_live_actions_without_a_due_time_are_lost_each_with_its_reason(agent_actor: Actor, bounds: Any) -> None:
    submitting, unknown, settling, fine = (authorized_refund(agent_actor) for _ in range(4))
    set_row(submitting, status=S.SUBMITTING, status_changed_at=NOW, lease_expires_at=None)
    set_row(unknown, status=S.UNKNOWN, status_changed_at=NOW, next_reconcile_at=None)
    set_row(settling, status=S.SETTLING, status_changed_at=NOW, next_reconcile_at=None)
    set_row(fine, status=S.SUBMITTING, status_changed_at=NOW, lease_expires_at=NOW)

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == sorted(
        [
            (8, submitting.action_id, "SUBMITTING without a lease expiry: the lease sweep would never move it on"),
            (8, unknown.action_id, "UNKNOWN with no reconciliation due: the reconciliation sweep would never pick it"),
            (
                8,
                settling.action_id,
                "SETTLING with no reconciliation due: the reconciliation sweep would never pick it",
            ),
        ]
    )
    assert (report.lost, report.lost_by_kind) == (3, per_kind(refund=3))
    assert report.decisions_due == 0


def _approval(action: Action, policy: str, approver: Any = None, pk: int | None = None) -> None:
    Approval.objects.create(
        pk=pk,
        action=action,
        approver=approver,
        decided_by_label=approver.username if approver else "policy",
        policy=policy,
        decision=Decision.APPROVE,
        decided_at=NOW,
        expires_at=NOW,
        order_version=1,
        amount=action.amount,
        currency=action.currency,
        payload_hash=action.payload_hash,
    )


def test_only_the_last_approval_of_a_stale_action_says_whether_a_person_must_decide_again(
    agent_actor: Actor, manager: Any
) -> None:
    """Approvals are read in the order they were made: the last one is the one in force."""
    policy_last = propose(agent_actor, "10.00")  # approved by the policy on proposal
    manager_last = propose(agent_actor, "11.00")
    _approval(manager_last, ApprovalPolicy.MANAGER, manager)
    _approval(policy_last, ApprovalPolicy.MANAGER, manager)
    _approval(policy_last, ApprovalPolicy.AUTO)
    for action in (policy_last, manager_last):
        set_row(action, status=S.STALE)

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == [
        (8, policy_last.action_id, "STALE after the policy's approval, with no new decision by the policy and none due")
    ]
    assert (report.decisions_due, report.lost, report.lost_by_kind) == (1, 1, per_kind(refund=1))


def test_the_approval_in_force_is_the_last_made_even_when_the_table_holds_it_first(
    agent_actor: Actor, manager: Any
) -> None:
    """ "Last" means the highest key, not where the row happens to sit in the table: the
    manager's later approval is stored before the policy's earlier one here."""
    action = propose(agent_actor, "11.00")
    Approval.objects.filter(action=action).delete()
    _approval(action, ApprovalPolicy.MANAGER, manager, pk=900_002)
    _approval(action, ApprovalPolicy.AUTO, pk=900_001)
    set_row(action, status=S.STALE)

    report = check_effects(ledger=[], now=NOW)

    assert (found(report, 8), report.decisions_due) == ([], 1)


def test_who_may_decide_is_read_only_when_a_decision_is_due(agent_actor: Actor, monkeypatch: Any) -> None:
    """The audit runs over every action; reading every user's permissions and limits is done
    only when some action waits for a person."""
    set_row(authorized_refund(agent_actor), status=S.SUBMITTING, lease_expires_at=NOW)

    def unexpected() -> dict[int, dict[str, Decimal]]:
        raise AssertionError("deciders read although no decision is due")

    monkeypatch.setattr("actions.engine.invariants.decider_limits_by_user", unexpected)

    report = check_effects(ledger=[], now=NOW)

    assert (report.decisions_due, found(report, 8)) == (0, [])


def test_a_decision_at_exactly_a_managers_limit_is_due_and_one_cent_more_is_lost(
    agent_actor: Actor, manager: Any
) -> None:
    at_limit, over, other_currency = propose(agent_actor, "500.00"), propose(agent_actor, "500.01"), None
    # The manager has no GBP limit: no limit is less than any amount, even one pound.
    other_currency = propose(agent_actor, "1.00", currency="GBP")
    for action in (at_limit, over, other_currency):
        set_row(action, status=S.PROPOSED)

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == sorted(
        [
            (
                8,
                over.action_id,
                "PROPOSED waiting for a decision, but no active user may decide 500.01 EUR (no approval limit covers "
                "it, its proposer and its agent's owner aside)",
            ),
            (
                8,
                other_currency.action_id,
                "PROPOSED waiting for a decision, but no active user may decide 1.00 GBP (no approval limit covers "
                "it, its proposer and its agent's owner aside)",
            ),
        ]
    )
    assert (report.decisions_due, report.lost) == (3, 2)


def test_a_person_who_proposed_may_not_decide_so_a_proposal_only_they_could_decide_is_lost(manager: Any) -> None:
    proposer = Actor.for_user(manager)
    action = set_row(propose(proposer, "50.00"), status=S.PROPOSED)

    report = check_effects(ledger=[], now=NOW)

    assert [subject for _, subject, _ in found(report, 8)] == [action.action_id]
    make_user("mona.manager", "manager", limits={"EUR": "50"})
    assert found(check_effects(ledger=[], now=NOW), 8) == []


@pytest.mark.usefixtures("supplier")
def test_an_email_with_nobody_to_decide_it_is_lost_in_those_words(agent_actor: Actor) -> None:
    """An email moves no money: the check asks only for someone allowed to decide."""
    action = supplier_email_propose(
        supplier="ACME",
        reference="bill-1042",
        template="bill_adjusted",
        parameters=BILL_PARAMETERS,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    assert action.status == S.PROPOSED

    report = check_effects(ledger=[], now=NOW)

    assert found(report, 8) == [
        (
            8,
            action.action_id,
            "PROPOSED waiting for a decision, but no active user may decide it (its proposer and its agent's "
            "owner may not)",
        )
    ]
    assert (report.decisions_due, report.lost, report.lost_by_kind) == (1, 1, per_kind(supplier_email=1))

    make_user("mo.manager", "manager")  # no limit at all, and none needed
    report = check_effects(ledger=[], now=NOW)
    assert (found(report, 8), report.decisions_due) == ([], 1)


def test_who_may_decide_active_users_by_group_or_own_permission_or_superuser_with_their_limits() -> None:
    by_group = make_user("gina.group", "manager", limits={"EUR": "500", "USD": "20"})
    own = make_user("olga.own", limits={"EUR": "7"})
    own.user_permissions.add(Permission.objects.get(codename="decide_action"))
    boss = make_user("sam.superuser", is_superuser=True)
    make_user("ivan.inactive", "manager", limits={"EUR": "900"}, is_active=False)
    make_user("carl.clerk", limits={"EUR": "900"})  # a limit alone is no permission

    assert decider_limits_by_user() == {
        by_group.pk: {"EUR": Decimal("500.00"), "USD": Decimal("20.00")},
        own.pk: {"EUR": Decimal("7.00")},
        boss.pk: {},
    }
