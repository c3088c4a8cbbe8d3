"""Finance's services: owners, live lookups, the three resolutions of NEEDS_REVIEW, taking an
UNKNOWN action over, and the follow-up workflow (docs/architecture.md sections 4 and 7).

The resolutions run against the live sandbox provider, where a test plants what "really
happened" (a succeeded refund, a pending one, or nothing), and the service must agree with the
provider's live answer or refuse. The sandbox's ledger is the witness.

The builders at the top are shared by the other review test modules: each one takes a refund
through the real services (proposal, auto-approval, reservation, the recording of a hand-made
answer, escalation) to the state a test needs.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.engine import resolutions
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.escalation import action_escalate
from actions.engine.record import submission_record
from actions.engine.resolution_checks import ReviewRefused
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import answer_from_refund, provider_from_settings
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyKind,
    FollowUpStatus,
    Order,
    Remedy,
    RemedyKind,
)
from actions.providers.base import AmbiguousError, DefinitiveError, ProviderRefund, RefundStatus
from actions.review import services as finance_services
from actions.services import Actor, action_transition
from tests.actions.test_reconciliation import AMOUNT, AMOUNT_MINOR, CHARGE_MINOR, authorized_refund
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_user
from tests.providers.sandbox_client import SandboxClient

pytestmark = pytest.mark.django_db

S = ActionStatus

# --- builders shared with the other review test modules ------------------------------------------


def provider_refund(action: Action, *, reference: str, status: RefundStatus) -> ProviderRefund:
    """A refund as the provider would report it, for answers recorded without calling it."""
    raw = {
        "id": reference,
        "object": "refund",
        "charge": action.payload["charge"],
        "amount": AMOUNT_MINOR,
        "currency": "eur",
        "status": str(status),
        "metadata": {"action_id": action.action_id},
    }
    return ProviderRefund(
        id=reference,
        charge=action.payload["charge"],
        amount_minor=AMOUNT_MINOR,
        currency="eur",
        status=status,
        metadata={"action_id": action.action_id},
        created=int(time.time()),
        raw=raw,
    )


def submitting(proposer: Actor, *, now: datetime | None = None) -> Action:
    """AUTHORIZED -> SUBMITTING with a lease from ``now`` (in the past: the lease has expired)."""
    action = authorized_refund(proposer)
    claim = submission_begin(action_pk=action.pk, now=now)
    assert claim.outcome == ClaimOutcome.CLAIMED
    return Action.objects.get(pk=action.pk)


def answered(proposer: Actor, answer_for: Any) -> Action:
    """Submit a refund and record ``answer_for(action)`` as the provider's answer, as the worker does."""
    action = authorized_refund(proposer)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.attempt is not None and claim.lease_token is not None
    submission_record(
        action_pk=action.pk, attempt_pk=claim.attempt.pk, lease_token=claim.lease_token, answer=answer_for(action)
    )
    return Action.objects.get(pk=action.pk)


def timed_out(action: Action) -> Answer:
    return Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="connection_error"))


def unknown(proposer: Actor) -> Action:
    action = answered(proposer, timed_out)
    assert action.status == S.UNKNOWN
    return action


def escalated(proposer: Actor, *, owner: Any = None, due_at: datetime | None = None) -> Action:
    """UNKNOWN -> NEEDS_REVIEW. Without ``owner`` the owner group's least busy member gets it,
    as when the reconciler escalates; with one, that person (as when finance takes it over)."""
    action = unknown(proposer)
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=action.pk)
        now = timezone.now()
        if owner is None:
            action_escalate(
                action=locked,
                actor=Actor.system("reconciler"),
                now=now,
                reason="Three reconciliation attempts could not reach a conclusion.",
                evidence={},
            )
        else:
            action_transition(
                action=locked,
                transition="escalate",
                actor=Actor.system("reconciler"),
                reason="Escalated for the test.",
                now=now,
                owner=owner,
                due_at=due_at or now + timedelta(hours=24),
            )
    action = Action.objects.get(pk=action.pk)
    assert action.status == S.NEEDS_REVIEW
    return action


def settling(proposer: Actor) -> Action:
    action = answered(
        proposer,
        lambda a: answer_from_refund(provider_refund(a, reference=f"re_pending_{a.pk}", status=RefundStatus.PENDING)),
    )
    assert action.status == S.SETTLING
    return action


def succeeded(proposer: Actor) -> Action:
    action = answered(
        proposer,
        lambda a: answer_from_refund(provider_refund(a, reference=f"re_done_{a.pk}", status=RefundStatus.SUCCEEDED)),
    )
    assert action.status == S.SUCCEEDED
    return action


def failed(proposer: Actor) -> Action:
    """FAILED_FINAL, with the remedy the worker opens automatically."""
    action = answered(
        proposer,
        lambda a: Answer(
            Outcome.FAILED_FINAL, error=DefinitiveError("Charge is disputed.", code="charge_disputed", http_status=400)
        ),
    )
    assert action.status == S.FAILED_FINAL
    return action


def stuck_submitting(proposer: Actor) -> Action:
    """SUBMITTING whose lease expired ten minutes ago with no recorded outcome."""
    return submitting(proposer, now=timezone.now() - timedelta(minutes=11))


def events(action: Action) -> list[tuple[str, str, str]]:
    return list(
        ActionEvent.objects.filter(action=action).order_by("pk").values_list("transition", "from_state", "to_state")
    )


def money(action: Action) -> tuple[Decimal, Decimal]:
    order = Order.objects.get(actions=action)
    assert_order_money_adds_up(order)
    return order.refunded_amount, order.reserved_amount


def snapshot(action: Action) -> dict[str, Any]:
    """Everything a refused change could have written, read fresh."""
    fresh = Action.objects.get(pk=action.pk)
    return {
        "status": fresh.status,
        "owner": fresh.owner_id,
        "events": ActionEvent.objects.filter(action=action).count(),
        "money": money(action),
        "remedies": Remedy.objects.filter(action=action).count(),
        "submissions": Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).count(),
    }


def lookups(action: Action) -> list[Attempt]:
    return list(Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP).order_by("pk"))


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    """Auto-approval publishes a dispatch on commit; nothing here needs a worker."""
    return dispatched


@pytest.fixture
def felix(db: Any) -> Any:
    return make_user("felix.finance", "finance")


@pytest.fixture
def sandbox(live_sandbox: SandboxClient, settings: Any) -> SandboxClient:
    """The live sandbox; the console trusts a not-found at once (no lookup visibility delay)."""
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    provider_from_settings.cache_clear()
    return live_sandbox


def at_provider(
    sandbox: SandboxClient, action: Action, *, status: str = "succeeded", amount: int = AMOUNT_MINOR
) -> str:
    """Plant the refund the provider "really" made for the action; returns its reference."""
    refund = sandbox.plant_refund(
        charge=action.payload["charge"], amount=amount, status=status, metadata={"action_id": action.action_id}
    )
    return str(refund["id"])


def charge_exists(sandbox: SandboxClient, action: Action) -> None:
    sandbox.seed_charge(action.payload["charge"], CHARGE_MINOR, "eur")


# --- confirmed at the provider -> SUCCEEDED -------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_refund_the_provider_confirms_is_resolved_as_succeeded_and_its_money_booked(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any
) -> None:
    """Invariants 2, 5, 9 and 10: finance records SUCCEEDED with the provider's reference, the
    reservation becomes refunded money in the same transaction, and the audit trail names who."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    reference = at_provider(sandbox, action)
    assert money(action) == (Decimal("0"), AMOUNT)

    result = resolutions.action_resolve_succeeded(
        action_pk=action.pk, user=finance, provider_reference=reference, reason="The timeout had committed."
    )

    action = Action.objects.get(pk=action.pk)
    assert action.status == S.SUCCEEDED
    assert action.provider_reference == reference
    assert money(action) == (AMOUNT, Decimal("0"))
    last = ActionEvent.objects.filter(action=action).latest("pk")
    assert (last.transition, last.from_state, last.to_state) == ("resolve_succeeded", S.NEEDS_REVIEW, S.SUCCEEDED)
    assert last.actor_user == finance
    assert last.reason == "The timeout had committed."
    assert last.evidence["provider_reference"] == reference
    # The live check is on record as a lookup attempt, with what the provider said.
    check = lookups(action)[-1]
    assert result.check == check
    assert check.outcome == "found"
    assert check.request["requested_by"] == finance.username
    assert check.response is not None
    assert [r["id"] for r in check.response["effects"]] == [reference]
    assert reference in result.message


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("planted", "claimed", "why"),
    [
        (None, "re_made_up", "The provider has no refund for this action"),
        ("succeeded", "re_someone_elses", "not re_someone_elses"),
        ("pending", None, "is pending, not succeeded"),
    ],
    ids=["no-refund", "other-reference", "still-pending"],
)
def test_succeeded_is_refused_when_the_provider_does_not_show_that_refund(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any, planted: str | None, claimed: str | None, why: str
) -> None:
    """Invariant 2: nothing is SUCCEEDED without exactly that effect at the receiver. The refusal
    explains what the provider has, changes nothing, and keeps the provider's answer as a lookup."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    reference = at_provider(sandbox, action, status=planted) if planted else ""
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_succeeded(
            action_pk=action.pk, user=finance, provider_reference=claimed or reference, reason="Customer says so."
        )

    assert refused.value.status == 409
    assert refused.value.code == "provider_disagrees"
    assert why in str(refused.value)
    assert snapshot(action) == before
    assert len(lookups(action)) == 1


# --- not executed -> FAILED_FINAL with a remedy ---------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_refund_the_provider_never_made_is_resolved_as_failed_with_a_remedy_and_its_reservation_released(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any
) -> None:
    """Invariants 5, 8 and 9: FAILED_FINAL releases the reservation and opens the chosen remedy
    for the amount the customer expects, owned by the person who resolved it."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    # A refund the provider created and then failed is a record, not an effect.
    at_provider(sandbox, action, status="failed")

    result = resolutions.action_resolve_failed(
        action_pk=action.pk,
        user=finance,
        reason="The provider failed it; the card is closed.",
        remedy_kind=RemedyKind.MANUAL_TRANSFER,
        expected_amount="20.00",
    )

    action = Action.objects.get(pk=action.pk)
    assert action.status == S.FAILED_FINAL
    assert money(action) == (Decimal("0"), Decimal("0"))
    assert events(action)[-1] == ("resolve_failed", S.NEEDS_REVIEW, S.FAILED_FINAL)
    remedy = Remedy.objects.get(action=action)
    assert result.remedy == remedy
    assert (remedy.kind, remedy.amount, remedy.currency, remedy.status) == (
        RemedyKind.MANUAL_TRANSFER,
        Decimal("20.00"),
        "EUR",
        FollowUpStatus.OPEN,
    )
    assert remedy.owner == finance
    assert "The provider failed it; the card is closed." in remedy.note


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("planted", ["succeeded", "pending"])
def test_failed_is_refused_when_the_provider_shows_a_refund_that_happened_or_will(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any, planted: str
) -> None:
    """Invariant 1: recording FAILED_FINAL (and paying the customer another way) while the
    provider has the refund would pay twice. Refused, with the provider's refund named."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    reference = at_provider(sandbox, action, status=planted)
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_failed(
            action_pk=action.pk, user=finance, reason="Looks failed.", remedy_kind=RemedyKind.STORE_CREDIT
        )

    assert refused.value.status == 409
    assert f"{reference} ({planted})" in str(refused.value)
    assert snapshot(action) == before


# --- not executed -> retry with the same key ------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_retry_after_a_fresh_not_found_sends_once_more_with_the_same_key_and_succeeds_once(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any
) -> None:
    """Invariants 1, 3 and 7: a retry needs a recent authoritative not-found; it takes a new
    lease, records the attempt before the call, and the provider ends with exactly one refund."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    looked = resolutions.action_lookup(action_pk=action.pk, user=finance)
    assert looked.attempt.outcome == "not_found"

    result = resolutions.action_resolve_retry(action_pk=action.pk, user=finance, reason="Not at the provider; resend.")

    action = Action.objects.get(pk=action.pk)
    assert result.outcome == S.SUCCEEDED
    assert action.status == S.SUCCEEDED
    assert [t for t, _, _ in events(action)][-2:] == ["resolve_retry", "record_success"]
    assert events(action)[-2][1:] == (S.NEEDS_REVIEW, S.SUBMITTING)
    submits = list(Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).order_by("pk"))
    assert len(submits) == 2
    assert {a.idempotency_key for a in submits} == {action.action_id}
    assert submits[-1].held_lease is True
    assert money(action) == (AMOUNT, Decimal("0"))
    ledger = [r for r in sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]
    assert [r["id"] for r in ledger] == [action.provider_reference]


@pytest.mark.django_db
def test_a_retry_without_a_recent_not_found_lookup_is_refused_before_the_provider_is_asked(
    agent_actor: Actor, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 7: no retry without evidence. Nothing is sent, nothing is written."""
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", _provider_must_not_be_called)
    action = escalated(agent_actor, owner=finance)
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_retry(action_pk=action.pk, user=finance, reason="Try again.")

    assert refused.value.status == 409
    assert "Look the action up at the provider first" in str(refused.value)
    assert snapshot(action) == before
    assert lookups(action) == []


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_not_found_older_than_the_setting_no_longer_allows_a_retry(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any, settings: Any
) -> None:
    """Invariant 7: the evidence for a retry expires (REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS)."""
    settings.REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS = 60
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    looked = resolutions.action_lookup(action_pk=action.pk, user=finance)
    # Attempts are evidence rows, not the audit trail: moving the clock of one is how the test ages it.
    Attempt.objects.filter(pk=looked.attempt.pk).update(finished_at=timezone.now() - timedelta(seconds=61))
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_retry(action_pk=action.pk, user=finance, reason="Try again.")

    assert "older than 1 min" in str(refused.value)
    assert snapshot(action) == before


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("planted", ["succeeded", "pending"])
def test_a_retry_is_refused_when_the_refund_appeared_at_the_provider_since_the_lookup(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any, planted: str
) -> None:
    """Invariant 1: the resolution asks again; a refund that became visible since the lookup
    stops the retry that would have paid twice."""
    action = escalated(agent_actor, owner=finance)
    charge_exists(sandbox, action)
    resolutions.action_lookup(action_pk=action.pk, user=finance)
    reference = at_provider(sandbox, action, status=planted)
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_retry(action_pk=action.pk, user=finance, reason="Try again.")

    assert refused.value.code == "provider_disagrees"
    assert reference in str(refused.value)
    assert snapshot(action) == before
    assert [r["id"] for r in sandbox.ledger()] == [reference]


# --- the live lookup --------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_lookup_keeps_the_providers_live_answer_as_an_attempt_without_changing_the_action(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any
) -> None:
    """Invariant 9's companion: every call to the receiver is on record; a lookup moves nothing."""
    action = unknown(agent_actor)
    charge_exists(sandbox, action)
    reference = at_provider(sandbox, action)
    before = snapshot(action)

    result = resolutions.action_lookup(action_pk=action.pk, user=finance)

    assert result.lookup.verdict == "found"
    attempt = Attempt.objects.get(pk=result.attempt.pk)
    assert (attempt.kind, attempt.outcome, attempt.idempotency_key) == (AttemptKind.LOOKUP, "found", action.action_id)
    assert attempt.request["requested_by"] == finance.username
    assert attempt.response is not None
    assert attempt.response["effects"][0]["id"] == reference
    assert attempt.finished_at is not None
    assert snapshot(action) == before


@pytest.mark.django_db
def test_an_action_never_sent_has_nothing_to_look_up(agent_actor: Actor, finance: Any) -> None:
    """Invariant 3's other side: no call to the receiver for an action that was never submitted."""
    action = authorized_refund(agent_actor)
    with pytest.raises(ReviewRefused, match="never been sent"):
        resolutions.action_lookup(action_pk=action.pk, user=finance)
    assert lookups(action) == []


# --- who may resolve ----------------------------------------------------------------------------


def _provider_must_not_be_called() -> Any:
    raise AssertionError("the provider must not be asked for a refused change")


@pytest.mark.parametrize(
    "call",
    [
        lambda pk, user: resolutions.action_resolve_succeeded(
            action_pk=pk, user=user, provider_reference="re_1", reason="r"
        ),
        lambda pk, user: resolutions.action_resolve_failed(action_pk=pk, user=user, reason="r", remedy_kind="cheque"),
        lambda pk, user: resolutions.action_resolve_retry(action_pk=pk, user=user, reason="r"),
        lambda pk, user: resolutions.action_lookup(action_pk=pk, user=user),
        lambda pk, user: finance_services.action_assign(action_pk=pk, user=user),
    ],
    ids=["succeeded", "failed", "retry", "lookup", "assign"],
)
def test_a_manager_cannot_resolve_look_up_or_take_an_action(
    call: Any, agent_actor: Actor, manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 10: only finance resolves. The service refuses by itself, before asking anyone."""
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", _provider_must_not_be_called)
    action = escalated(agent_actor)
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        call(action.pk, manager)

    assert refused.value.status == 403
    assert snapshot(action) == before


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"resolution": "succeeded", "provider_reference": "re_1", "reason": "  "}, "reason"),
        ({"resolution": "succeeded", "provider_reference": "", "reason": "ok"}, "provider_reference"),
        ({"resolution": "succeeded", "provider_reference": "re 1; drop", "reason": "ok"}, "provider_reference"),
        ({"resolution": "failed", "remedy_kind": "gift", "reason": "ok"}, "remedy_kind"),
        (
            {"resolution": "failed", "remedy_kind": "cheque", "reason": "ok", "expected_amount": "20.001"},
            "expected_amount",
        ),
        (
            {"resolution": "failed", "remedy_kind": "cheque", "reason": "ok", "expected_amount": "999"},
            "expected_amount",
        ),
        ({"resolution": "failed", "remedy_kind": "cheque", "reason": "x" * 1001}, "reason"),
    ],
)
def test_bad_resolution_input_is_refused_naming_the_field_before_anything_is_asked_or_written(
    arguments: dict[str, Any], field: str, agent_actor: Actor, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 11: a clear error naming the field; the provider is not asked, nothing is written."""
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", _provider_must_not_be_called)
    action = escalated(agent_actor, owner=finance)
    before = snapshot(action)
    arguments = dict(arguments)
    resolution = arguments.pop("resolution")

    with pytest.raises(ReviewRefused) as refused:
        if resolution == "succeeded":
            resolutions.action_resolve_succeeded(action_pk=action.pk, user=finance, **arguments)
        else:
            resolutions.action_resolve_failed(action_pk=action.pk, user=finance, **arguments)

    assert (refused.value.status, refused.value.field) == (400, field)
    assert str(refused.value).startswith(f"{field}:")
    assert snapshot(action) == before
    assert lookups(action) == []


def test_an_action_that_is_not_waiting_for_review_cannot_be_resolved(
    agent_actor: Actor, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 7: an UNKNOWN action belongs to reconciliation; finance resolves only NEEDS_REVIEW."""
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", _provider_must_not_be_called)
    action = unknown(agent_actor)
    before = snapshot(action)

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_failed(action_pk=action.pk, user=finance, reason="r", remedy_kind="cheque")

    assert refused.value.status == 409
    assert "not waiting for review" in str(refused.value)
    assert snapshot(action) == before


# --- owners -------------------------------------------------------------------------------------


def test_taking_an_action_records_the_owner_in_the_trail_without_changing_its_state(
    agent_actor: Actor, finance: Any, felix: Any
) -> None:
    """Invariants 8 and 9: the owner is a named person and the change is audited; the event runs
    from the status to itself, so the trail stays a chain."""
    action = unknown(agent_actor)

    finance_services.action_assign(action_pk=action.pk, user=finance, note="Mine today.")
    finance_services.action_assign(action_pk=action.pk, user=finance, owner_pk=felix.pk)

    action = Action.objects.get(pk=action.pk)
    assert action.status == S.UNKNOWN
    assert action.owner == felix
    trail = list(ActionEvent.objects.filter(action=action, transition="assign_owner").order_by("pk"))
    assert [(e.from_state, e.to_state) for e in trail] == [(S.UNKNOWN, S.UNKNOWN)] * 2
    assert trail[0].reason == "Mine today."
    assert trail[1].evidence == {"owner": felix.username, "previous_owner": finance.username}
    assert all(e.actor_user == finance for e in trail)


def test_an_action_can_only_be_given_to_an_active_member_of_finance(
    agent_actor: Actor, finance: Any, manager: Any
) -> None:
    """Invariant 8: a named owner who can resolve it; a manager is not one."""
    action = unknown(agent_actor)
    before = snapshot(action)
    for owner_pk in (manager.pk, "not-a-number", 999_999):
        with pytest.raises(ReviewRefused) as refused:
            finance_services.action_assign(action_pk=action.pk, user=finance, owner_pk=owner_pk)
        assert (refused.value.status, refused.value.field) == (400, "owner")
    assert snapshot(action) == before


def test_taking_over_an_unknown_action_escalates_it_to_me_now(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8: UNKNOWN -> NEEDS_REVIEW with a named owner and a due time; polling stops."""
    action = unknown(agent_actor)

    resolutions.action_escalate_to_user(action_pk=action.pk, user=finance, reason="Customer is calling.")

    action = Action.objects.get(pk=action.pk)
    assert action.status == S.NEEDS_REVIEW
    assert action.owner == finance
    assert action.due_at is not None and action.due_at > timezone.now()
    assert action.next_reconcile_at is None
    event = ActionEvent.objects.filter(action=action).latest("pk")
    assert (event.transition, event.from_state, event.to_state) == ("escalate", S.UNKNOWN, S.NEEDS_REVIEW)
    assert "Customer is calling." in event.reason
    with pytest.raises(ReviewRefused, match="not unknown"):
        resolutions.action_escalate_to_user(action_pk=action.pk, user=finance)


def test_with_review_owners_only_finance_cannot_act_on_a_colleagues_action(
    agent_actor: Actor, finance: Any, felix: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 10 (and REVIEW_OWNERS_ONLY): another owner's item is refused, nothing written."""
    settings.REVIEW_OWNERS_ONLY = True
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", _provider_must_not_be_called)
    theirs = escalated(agent_actor, owner=felix)
    before = snapshot(theirs)

    attempts = [
        lambda: finance_services.action_assign(action_pk=theirs.pk, user=finance),
        lambda: resolutions.action_lookup(action_pk=theirs.pk, user=finance),
        lambda: resolutions.action_resolve_failed(action_pk=theirs.pk, user=finance, reason="r", remedy_kind="cheque"),
        lambda: resolutions.action_resolve_retry(action_pk=theirs.pk, user=finance, reason="r"),
    ]
    for attempt in attempts:
        with pytest.raises(ReviewRefused) as refused:
            attempt()
        assert refused.value.status == 403
        assert "belongs to felix.finance" in str(refused.value)
    assert snapshot(theirs) == before

    # Unassigned items are anyone's to take.
    open_one = unknown(agent_actor)
    finance_services.action_assign(action_pk=open_one.pk, user=finance)
    assert Action.objects.get(pk=open_one.pk).owner == finance


# --- remedies and discrepancies -------------------------------------------------------------------


def test_a_remedy_goes_open_in_progress_done_with_owner_and_notes(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8 for the customer's money: the remedy is worked to done by a named person, and
    each step shows in the failed action's trail."""
    action = failed(agent_actor)
    remedy = Remedy.objects.get(action=action)
    assert remedy.kind == RemedyKind.UNDECIDED

    finance_services.remedy_advance(
        remedy_pk=remedy.pk, user=finance, to_status="in_progress", note="Calling the customer."
    )
    with pytest.raises(ReviewRefused) as undecided:
        finance_services.remedy_advance(remedy_pk=remedy.pk, user=finance, to_status="done", note="Paid.")
    assert undecided.value.field == "remedy_kind"
    with pytest.raises(ReviewRefused) as no_note:
        finance_services.remedy_advance(remedy_pk=remedy.pk, user=finance, to_status="done", remedy_kind="store_credit")
    assert no_note.value.field == "note"
    finance_services.remedy_advance(
        remedy_pk=remedy.pk, user=finance, to_status="done", remedy_kind="store_credit", note="Voucher V-77 sent."
    )

    remedy = Remedy.objects.get(pk=remedy.pk)
    assert (remedy.status, remedy.kind, remedy.owner) == (FollowUpStatus.DONE, RemedyKind.STORE_CREDIT, finance)
    assert "Calling the customer." in remedy.note
    assert "Voucher V-77 sent." in remedy.note
    assert [t for t, _, _ in events(action)][-2:] == ["remedy_in_progress", "remedy_done"]
    assert events(action)[-1][1:] == (S.FAILED_FINAL, S.FAILED_FINAL)
    with pytest.raises(ReviewRefused, match="cannot move"):
        finance_services.remedy_advance(remedy_pk=remedy.pk, user=finance, to_status="in_progress")


def test_a_discrepancy_is_worked_to_explained_or_corrected_and_cannot_skip_a_step(finance: Any) -> None:
    """Invariants 8 and 11: a discrepancy ends explained or corrected by a named person; a bad
    status is refused naming the field."""
    discrepancy = Discrepancy.objects.create(
        kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_stray", details={"amount_minor": 500}
    )

    with pytest.raises(ReviewRefused, match="cannot move"):
        finance_services.discrepancy_advance(
            discrepancy_pk=discrepancy.pk, user=finance, to_status="explained", note="x"
        )
    with pytest.raises(ReviewRefused) as bad:
        finance_services.discrepancy_advance(discrepancy_pk=discrepancy.pk, user=finance, to_status="closed")
    assert (bad.value.status, bad.value.field) == (400, "status")
    finance_services.discrepancy_assign(discrepancy_pk=discrepancy.pk, user=finance, note="Looking into it.")
    finance_services.discrepancy_advance(discrepancy_pk=discrepancy.pk, user=finance, to_status="in_progress")
    finance_services.discrepancy_advance(
        discrepancy_pk=discrepancy.pk,
        user=finance,
        to_status="explained",
        note="A refund made by hand in the dashboard.",
    )

    discrepancy = Discrepancy.objects.get(pk=discrepancy.pk)
    assert (discrepancy.status, discrepancy.owner) == ("explained", finance)
    assert "Looking into it." in discrepancy.note
    assert "made by hand" in discrepancy.note


def test_a_manager_cannot_work_a_remedy(agent_actor: Actor, manager: Any) -> None:
    """Invariant 10: remedies are finance's (and admins') work."""
    remedy = Remedy.objects.get(action=failed(agent_actor))
    with pytest.raises(ReviewRefused) as refused:
        finance_services.remedy_advance(remedy_pk=remedy.pk, user=manager, to_status="in_progress")
    assert refused.value.status == 403
    assert Remedy.objects.get(pk=remedy.pk).status == FollowUpStatus.OPEN


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_recording_failed_is_refused_while_the_last_attempt_could_still_reach_the_provider(
    finance: Any, agent_actor: Actor, live_sandbox: Any, settings: Any
) -> None:
    """Invariant 1: "failed" releases the reservation and opens a remedy (the customer is paid
    another way), so a not-found is only proof once no earlier attempt can still arrive."""
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0  # only the lease keeps it refused
    fresh = answered(agent_actor, timed_out)
    live_sandbox.seed_charge(fresh.payload["charge"], 10000, "eur")
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=fresh.pk)
        action_transition(
            action=locked,
            transition="escalate",
            actor=Actor.system("reconciler"),
            reason="test",
            owner=finance,
            due_at=timezone.now() + timedelta(hours=1),
        )

    with pytest.raises(ReviewRefused) as refused:
        resolutions.action_resolve_failed(action_pk=fresh.pk, user=finance, reason="r", remedy_kind="cheque")

    assert "could still reach the provider" in str(refused.value)
    assert Action.objects.get(pk=fresh.pk).status == S.NEEDS_REVIEW
    assert not Remedy.objects.filter(action=fresh).exists()
