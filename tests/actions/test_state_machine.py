"""The action's state machine (docs/architecture.md section 4), checked against a table written here.

The expected table below is copied by hand from the design, not read from the model's
transition metadata: a test derived from the code under test could not fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django_fsm import TransitionNotAllowed, has_transition_perm
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actions.models import Action, ActionStatus
from tests.factories import make_user

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

# --- the expected machine, from docs/architecture.md section 4 ------------------------------------------

ALL_STATES = (
    "NEW",
    "PROPOSED",
    "REJECTED",
    "AUTHORIZED",
    "STALE",
    "CANCELLED",
    "SUBMITTING",
    "SETTLING",
    "SUCCEEDED",
    "FAILED_FINAL",
    "UNKNOWN",
    "NEEDS_REVIEW",
)
TERMINAL = frozenset({"REJECTED", "CANCELLED", "SUCCEEDED", "FAILED_FINAL"})
# docs/architecture.md section 4: the reservation is held through these statuses.
RESERVING = frozenset({"SUBMITTING", "UNKNOWN", "SETTLING", "NEEDS_REVIEW"})

# transition -> (legal source states, target). A target that depends on the arguments is a
# function of the keyword arguments the transition was called with.
Target = str | Callable[[dict[str, Any]], str]
EXPECTED: dict[str, tuple[frozenset[str], Target]] = {
    "propose": (frozenset({"NEW"}), "PROPOSED"),
    "reject_proposal": (frozenset({"NEW"}), "REJECTED"),
    "approve": (frozenset({"PROPOSED"}), "AUTHORIZED"),
    "reject": (frozenset({"PROPOSED"}), "REJECTED"),
    "begin_submission": (frozenset({"AUTHORIZED"}), "SUBMITTING"),
    "invalidate": (frozenset({"AUTHORIZED"}), "STALE"),
    "reopen": (frozenset({"STALE"}), "PROPOSED"),
    "cancel": (frozenset({"PROPOSED", "AUTHORIZED", "STALE"}), "CANCELLED"),
    "record_success": (frozenset({"SUBMITTING"}), "SUCCEEDED"),
    "record_pending": (frozenset({"SUBMITTING"}), "SETTLING"),
    "record_failure": (frozenset({"SUBMITTING"}), "FAILED_FINAL"),
    "mark_unknown": (frozenset({"SUBMITTING"}), "UNKNOWN"),
    "reconcile_found": (frozenset({"UNKNOWN"}), lambda kwargs: kwargs["outcome"]),
    "retry": (frozenset({"UNKNOWN"}), "SUBMITTING"),
    "escalate": (frozenset({"UNKNOWN", "SUBMITTING"}), "NEEDS_REVIEW"),
    "settle": (frozenset({"SETTLING"}), lambda kwargs: "SUCCEEDED" if kwargs["succeeded"] else "FAILED_FINAL"),
    "resolve_succeeded": (frozenset({"NEEDS_REVIEW"}), "SUCCEEDED"),
    "resolve_failed": (frozenset({"NEEDS_REVIEW"}), "FAILED_FINAL"),
    "resolve_retry": (frozenset({"NEEDS_REVIEW"}), "SUBMITTING"),
    # The receiver proved nothing was sent (back for another send under the same
    # approval), and a person's "send again" to a receiver with no keys and no lookup.
    "record_not_sent": (frozenset({"SUBMITTING"}), "AUTHORIZED"),
    "resolve_resend": (frozenset({"NEEDS_REVIEW"}), "SUBMITTING"),
}

# The transitions a person decides, and the permission (by role, console/roles.py) they need.
PERMISSIONS = {
    "approve": "actions.decide_action",
    "reject": "actions.decide_action",
    "reopen": "actions.decide_action",
    "cancel": "actions.cancel_action",
    "resolve_succeeded": "actions.resolve_action",
    "resolve_failed": "actions.resolve_action",
    "resolve_retry": "actions.resolve_action",
    "resolve_resend": "actions.resolve_action",
}

# Argument variants that lead to different targets; every other transition has one variant.
VARIANTS: dict[str, tuple[str, ...]] = {
    "reconcile_found": ("SUCCEEDED", "SETTLING", "FAILED_FINAL"),
    "settle": ("succeeded", "failed"),
}

# How to reach each state in memory, through legal transitions only (the status is protected).
PATHS: dict[str, list[str]] = {
    "NEW": [],
    "PROPOSED": ["propose"],
    "REJECTED": ["reject_proposal"],
    "AUTHORIZED": ["propose", "approve"],
    "STALE": ["propose", "approve", "invalidate"],
    "CANCELLED": ["propose", "cancel"],
    "SUBMITTING": ["propose", "approve", "begin_submission"],
    "SUCCEEDED": ["propose", "approve", "begin_submission", "record_success"],
    "SETTLING": ["propose", "approve", "begin_submission", "record_pending"],
    "FAILED_FINAL": ["propose", "approve", "begin_submission", "record_failure"],
    "UNKNOWN": ["propose", "approve", "begin_submission", "mark_unknown"],
    "NEEDS_REVIEW": ["propose", "approve", "begin_submission", "mark_unknown", "escalate"],
}


def transition_kwargs(name: str, variant: str | None = None) -> dict[str, Any]:
    """Plausible arguments for one transition, as the services would pass them."""
    lease = {"lease_token": uuid.uuid4(), "lease_expires_at": NOW + timedelta(seconds=60), "started_at": NOW}
    by_name: dict[str, dict[str, Any]] = {
        "reject_proposal": {"reasons": [{"code": "refund_window_past", "message": "The window ended."}]},
        "reject": {"note": "The customer kept the goods."},
        "begin_submission": lease,
        "retry": lease,
        "resolve_retry": lease,
        "resolve_resend": lease,
        "record_success": {"provider_reference": "re_success"},
        "record_pending": {"provider_reference": "re_pending"},
        "record_failure": {"provider_reference": "re_failed"},
        "mark_unknown": {"next_reconcile_at": NOW + timedelta(seconds=30)},
        "reconcile_found": {"outcome": variant or "SUCCEEDED", "provider_reference": "re_found"},
        "escalate": {"owner": None, "due_at": NOW + timedelta(hours=24)},
        "settle": {"succeeded": (variant or "succeeded") == "succeeded"},
        "resolve_succeeded": {"provider_reference": "re_resolved"},
    }
    return dict(by_name.get(name, {}))


def expected_target(name: str, state: str, kwargs: dict[str, Any]) -> str | None:
    """Where ``name`` leads from ``state`` according to the design, or None if it is illegal."""
    sources, target = EXPECTED[name]
    if state not in sources:
        return None
    return target(kwargs) if callable(target) else target


def action_in(state: str) -> Action:
    """An unsaved action brought to ``state`` by legal transitions."""
    action = Action(action_id="refund:order-4821:request-1", amount="40.00", currency="EUR")
    for name in PATHS[state]:
        getattr(action, name)(**transition_kwargs(name))
    assert action.status == state, f"the path to {state} ended in {action.status}"
    return action


LEGAL_CASES = [
    pytest.param(source, name, variant, id=f"{source}-{name}" + (f"-{variant}" if variant else ""))
    for name, (sources, _) in EXPECTED.items()
    for source in sorted(sources)
    for variant in VARIANTS.get(name, (None,))
]
ILLEGAL_CASES = [
    pytest.param(state, name, id=f"{state}-{name}")
    for state in ALL_STATES
    for name in EXPECTED
    if state not in EXPECTED[name][0]
]


# --- the table ---------------------------------------------------------------------------------


def test_the_expected_table_covers_every_state_and_transition_of_the_model() -> None:
    """A status or transition added to the model without a row here would go untested."""
    model_transitions = {t.name for t in Action._meta.get_field("status").get_all_transitions(Action)}  # type: ignore[attr-defined]
    assert model_transitions == set(EXPECTED)
    assert set(ActionStatus.values) == set(ALL_STATES) == set(PATHS)


@pytest.mark.parametrize(("source", "name", "variant"), LEGAL_CASES)
def test_it_allows_every_transition_of_the_design(source: str, name: str, variant: str | None) -> None:
    action = action_in(source)
    kwargs = transition_kwargs(name, variant)

    getattr(action, name)(**kwargs)

    assert action.status == expected_target(name, source, kwargs)


@pytest.mark.parametrize(("state", "name"), ILLEGAL_CASES)
def test_it_refuses_every_transition_the_design_does_not_allow(state: str, name: str) -> None:
    action = action_in(state)

    with pytest.raises(TransitionNotAllowed):
        getattr(action, name)(**transition_kwargs(name))

    assert action.status == state


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_it_allows_nothing_at_all_from_a_terminal_state(state: str) -> None:
    """Invariant 8: a terminal action is done; no worker, sweep or person can move it again."""
    action = action_in(state)

    for name in EXPECTED:
        with pytest.raises(TransitionNotAllowed):
            getattr(action, name)(**transition_kwargs(name))

    assert action.status == state
    assert action.is_terminal


def test_it_refuses_a_reconciliation_outcome_that_is_not_a_receiver_status() -> None:
    """reconcile_found takes the receiver's status; anything else would invent a state."""
    action = action_in("UNKNOWN")

    for outcome in ("UNKNOWN", "SUBMITTING", "PROPOSED", "succeeded"):
        with pytest.raises(ValueError, match="not a reconciliation outcome"):
            action.reconcile_found(outcome=outcome, provider_reference="re_1")

    assert action.status == "UNKNOWN"


def test_taking_and_dropping_the_lease_follows_submitting() -> None:
    """Invariant 3: only the holder of a SUBMITTING lease may call the receiver, so the lease
    exists exactly while the action is SUBMITTING and every new submission takes a fresh one."""
    action = action_in("AUTHORIZED")
    first = transition_kwargs("begin_submission")

    action.begin_submission(**first)
    assert (action.lease_token, action.lease_expires_at) == (first["lease_token"], first["lease_expires_at"])
    assert action.attempt_count == 1
    assert action.first_attempt_at == action.last_attempt_at == NOW

    action.mark_unknown(next_reconcile_at=NOW + timedelta(seconds=30))
    assert action.lease_token is None and action.lease_expires_at is None
    assert action.next_reconcile_at == NOW + timedelta(seconds=30)

    second = transition_kwargs("retry")
    second["started_at"] = NOW + timedelta(minutes=5)
    action.retry(**second)
    assert action.lease_token == second["lease_token"] != first["lease_token"]
    assert action.attempt_count == 2
    assert action.first_attempt_at == NOW
    assert action.last_attempt_at == NOW + timedelta(minutes=5)
    assert action.next_reconcile_at is None

    action.record_success(provider_reference="re_123")
    assert action.lease_token is None
    assert action.provider_reference == "re_123"


@pytest.mark.parametrize("source", ["SUBMITTING", "UNKNOWN"])
def test_escalation_names_an_owner_and_a_due_date_and_stops_polling(source: str) -> None:
    """Invariant 8: an action in NEEDS_REVIEW has a named owner, and polling stops."""
    owner = User(username="fiona.finance")
    due = NOW + timedelta(hours=24)
    action = action_in(source)

    action.escalate(owner=owner, due_at=due)

    assert action.owner is owner
    assert action.due_at == due
    assert action.next_reconcile_at is None
    assert action.lease_token is None


def test_a_rejection_records_why() -> None:
    action = action_in("NEW")
    reasons = [{"code": "refund_window_past", "message": "The refund window of 90 days ended."}]
    action.reject_proposal(reasons=reasons)
    assert action.rejection_reasons == reasons

    action = action_in("PROPOSED")
    action.reject(note="Already refunded by bank transfer.")
    assert action.rejection_reasons == [
        {"code": "rejected_by_manager", "message": "Already refunded by bank transfer."}
    ]


# --- the protected status ----------------------------------------------------------------------


@pytest.mark.parametrize("state", ALL_STATES)
def test_it_refuses_to_set_the_status_by_assignment(state: str) -> None:
    action = action_in(state)
    other = "SUCCEEDED" if state != "SUCCEEDED" else "PROPOSED"

    with pytest.raises(AttributeError, match="modification is not allowed"):
        action.status = other

    assert action.status == state


@pytest.mark.django_db
def test_it_refuses_to_set_the_status_of_a_saved_action_by_assignment(propose: Any) -> None:
    action = Action.objects.get(pk=propose().action.pk)

    with pytest.raises(AttributeError):
        action.status = "SUCCEEDED"

    action.refresh_from_db()
    assert action.status == "PROPOSED"


# --- permissions ---------------------------------------------------------------------------------

PERMISSION_CASES = [
    # (transition, state it applies in, a role that may, a role that may not)
    ("approve", "PROPOSED", "manager", "finance"),
    ("approve", "PROPOSED", "manager", "agent"),
    ("reject", "PROPOSED", "manager", "finance"),
    ("reopen", "STALE", "manager", "finance"),
    ("cancel", "PROPOSED", "manager", "finance"),
    ("cancel", "AUTHORIZED", "admin", "agent"),
    ("cancel", "STALE", "manager", "finance"),
    ("resolve_succeeded", "NEEDS_REVIEW", "finance", "manager"),
    ("resolve_failed", "NEEDS_REVIEW", "finance", "manager"),
    ("resolve_retry", "NEEDS_REVIEW", "finance", "admin"),
    ("resolve_resend", "NEEDS_REVIEW", "finance", "manager"),
]


def test_the_permission_cases_cover_every_transition_that_needs_a_permission() -> None:
    assert {case[0] for case in PERMISSION_CASES} == set(PERMISSIONS)


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "state", "allowed_role", "refused_role"), PERMISSION_CASES)
def test_it_allows_a_transition_only_to_the_role_that_holds_its_permission(
    name: str, state: str, allowed_role: str, refused_role: str
) -> None:
    """Invariant 10: only managers decide, only finance resolves."""
    allowed = make_user(f"allowed.{allowed_role}", allowed_role)
    refused = make_user(f"refused.{refused_role}", refused_role)
    nobody = make_user("no.roles")
    action = action_in(state)

    assert has_transition_perm(getattr(action, name), allowed)
    assert allowed.has_perm(PERMISSIONS[name])
    assert not has_transition_perm(getattr(action, name), refused)
    assert not has_transition_perm(getattr(action, name), nobody)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "role", "wrong_state"),
    [
        ("approve", "manager", "AUTHORIZED"),
        ("cancel", "manager", "SUBMITTING"),
        ("resolve_failed", "finance", "UNKNOWN"),
    ],
)
def test_a_permitted_role_is_still_refused_in_the_wrong_state(name: str, role: str, wrong_state: str) -> None:
    """The buttons a person sees follow both the role and the state: a manager cannot cancel
    a refund that is already being submitted."""
    user = make_user(f"someone.{role}", role)

    assert not has_transition_perm(getattr(action_in(wrong_state), name), user)


# --- random walks ----------------------------------------------------------------------------------


class ActionLifecycle(RuleBasedStateMachine):
    """Random sequences of transitions on one in-memory action, each checked against EXPECTED.

    Half the steps pick any transition (mostly illegal ones, which must be refused and change
    nothing); the other half pick a legal one, so the walk reaches the deep states too.
    """

    action: Action
    state: str
    submissions: int

    @initialize()
    def new_action(self) -> None:
        self.action = Action(action_id="refund:order-1:request-1", amount="12.00", currency="EUR")
        self.state = "NEW"
        self.submissions = 0

    def _apply(self, name: str, variant: str | None) -> None:
        kwargs = transition_kwargs(name, variant)
        target = expected_target(name, self.state, kwargs)
        if target is None:
            with pytest.raises(TransitionNotAllowed):
                getattr(self.action, name)(**kwargs)
            assert self.action.status == self.state
            return
        getattr(self.action, name)(**kwargs)
        assert self.action.status == target, f"{name} from {self.state} went to {self.action.status}, not {target}"
        if target == "SUBMITTING":
            self.submissions += 1
            assert self.action.lease_token == kwargs["lease_token"]
        self.state = target

    @rule(name=st.sampled_from(sorted(EXPECTED)), data=st.data())
    def any_transition(self, name: str, data: st.DataObject) -> None:
        self._apply(name, data.draw(st.sampled_from(VARIANTS.get(name, (None,)))))

    @rule(data=st.data())
    def a_legal_transition(self, data: st.DataObject) -> None:
        legal = sorted(name for name, (sources, _) in EXPECTED.items() if self.state in sources)
        if not legal:
            return
        name = data.draw(st.sampled_from(legal))
        self._apply(name, data.draw(st.sampled_from(VARIANTS.get(name, (None,)))))

    @invariant()
    def the_status_is_the_expected_one(self) -> None:
        assert self.action.status == self.state

    @invariant()
    def a_lease_exists_exactly_while_submitting(self) -> None:
        """Invariant 3: nobody holds a lease outside SUBMITTING."""
        holds_lease = self.action.lease_token is not None
        assert holds_lease == (self.state == "SUBMITTING")
        assert (self.action.lease_expires_at is not None) == holds_lease

    @invariant()
    def every_submission_counts_as_one_attempt(self) -> None:
        assert self.action.attempt_count == self.submissions

    @invariant()
    def the_reservation_and_terminal_flags_follow_the_design(self) -> None:
        """Invariant 5: the reservation is held in exactly the reserving statuses."""
        assert self.action.holds_reservation == (self.state in RESERVING)
        assert self.action.is_terminal == (self.state in TERMINAL)

    @invariant()
    def a_succeeded_or_settling_action_keeps_its_receiver_reference(self) -> None:
        """Invariant 2: a SUCCEEDED action has its receiver reference recorded."""
        if self.state in {"SUCCEEDED", "SETTLING"}:
            assert self.action.provider_reference.startswith("re_")


ActionLifecycle.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestActionLifecycle = ActionLifecycle.TestCase
