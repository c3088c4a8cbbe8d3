"""Corrections by admins (docs/architecture.md section 1: "corrections go through the same
services as everything else").

A duplicate effect is found the way it would be: a refund the worker recorded, then the ledger
audit reading a second refund for the same action from the receiver. The correction proposes a
new, compensating action; it never edits the original one or its trail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import execution_dispatch
from actions.engine.escalation import action_escalate
from actions.engine.invariants import check_effects
from actions.engine.ledger import ledger_audit_run
from actions.engine.record import submission_record
from actions.engine.resolutions import action_resolve_succeeded
from actions.kinds.base import Answer
from actions.kinds.refund.contract import RefundReceiver, answer_from_refund
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import (
    Action,
    ActionEvent,
    ActionKind,
    ActionStatus,
    ActorKind,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    Order,
)
from actions.providers.base import ProviderGuarantees, ProviderRefund, RefundStatus
from actions.review.corrections import CorrectionRefused, action_owner_assign, discrepancy_compensate
from actions.services import Actor, payload_hash
from approvals.models import Decision
from approvals.services import DecisionRefused, approval_decide
from tests.factories import make_order, make_request, make_user

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    # Refunds wait for a manager, so each test decides when one is approved.
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dispatches published on commit, by action pk, instead of publishing to the broker."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


# --- building the situations -----------------------------------------------------------------


def refund_of(proposer: Actor, *, amount: str = "40.00", currency: str = "EUR") -> Action:
    order = make_order(currency=currency, captured="100.00" if currency != "JPY" else "10000")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=currency,
        reason_code="damaged",
        evidence="The parcel arrived crushed.",
        proposer=proposer,
    ).action


def provider_refund(action: Action, reference: str) -> ProviderRefund:
    raw = {"id": reference, "object": "refund", "status": "succeeded", "metadata": {"action_id": action.action_id}}
    return ProviderRefund(
        id=reference,
        charge=action.payload["charge"],
        amount_minor=int(action.amount * 100) if action.currency != "JPY" else int(action.amount),
        currency=action.currency.lower(),
        status=RefundStatus.SUCCEEDED,
        metadata={"action_id": action.action_id},
        created=int(timezone.now().timestamp()),
        raw=raw,
    )


def succeeded_refund(proposer: Actor, approver: Any, *, reference: str = "re_first", **kwargs: Any) -> Action:
    """A refund approved, submitted and confirmed by the receiver, through the worker's services."""
    action = refund_of(proposer, **kwargs)
    approval_decide(action_pk=action.pk, user=approver, decision=Decision.APPROVE)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.attempt is not None and claim.lease_token is not None
    answer = answer_from_refund(provider_refund(action, reference))
    submission_record(action_pk=action.pk, attempt_pk=claim.attempt.pk, lease_token=claim.lease_token, answer=answer)
    action = Action.objects.get(pk=action.pk)
    assert action.status == S.SUCCEEDED
    return action


@dataclass
class FakeLedger:
    """A receiver's ledger, as the audit reads it."""

    refunds: list[ProviderRefund]
    guarantees: ProviderGuarantees = field(
        default_factory=lambda: ProviderGuarantees(
            honours_idempotency_keys=True,
            key_retention=None,
            supports_lookup=True,
            lookup_authoritative=True,
            lookup_visibility_delay=timedelta(0),
        )
    )

    def iter_ledger(self, *, created_from: int | None = None, created_before: int | None = None) -> Any:
        return iter(self.refunds)


def duplicate_found(action: Action, *duplicates: str) -> Discrepancy:
    """The receiver paid ``action`` out again; the ledger audit finds it."""
    refunds = [provider_refund(action, action.provider_reference)]
    refunds += [provider_refund(action, reference) for reference in duplicates]
    ledger_audit_run(receivers={"refund": RefundReceiver(FakeLedger(refunds))}, now=timezone.now() + timedelta(hours=1))  # type: ignore[arg-type]
    return Discrepancy.objects.get(kind=DiscrepancyKind.DUPLICATE_EFFECT, action=action)


def snapshot(action: Action) -> dict[str, Any]:
    """Everything about an action a correction must leave alone, read fresh."""
    fresh = Action.objects.get(pk=action.pk)
    return {
        **{name: getattr(fresh, name) for name in Action.MATERIAL_FIELDS},
        "status": fresh.status,
        "provider_reference": fresh.provider_reference,
        "events": list(ActionEvent.objects.filter(action=action).values_list("pk", "transition", "created_at")),
    }


@pytest.fixture
def admin_user(db: Any) -> Any:
    return make_user("ada.admin", "admin", is_staff=True)


@pytest.fixture
def duplicate(agent_actor: Actor, manager: Any) -> Discrepancy:
    return duplicate_found(succeeded_refund(agent_actor, manager), "re_second")


# --- compensating a duplicate effect ---------------------------------------------------------


def test_a_duplicate_effect_is_compensated_by_a_new_proposed_action_never_by_editing_history(
    duplicate: Discrepancy, admin_user: Any
) -> None:
    """Invariants 4 and 9: the original action's material fields, status and trail are untouched;
    the compensation is a new action with its own id, key, payload and hash, waiting for a decision."""
    original = duplicate.action
    assert original is not None
    before = snapshot(original)

    compensation = discrepancy_compensate(
        discrepancy_pk=duplicate.pk, user=admin_user, note="Invoice the customer for the second refund."
    )

    assert compensation.pk != original.pk
    assert compensation.action_id == "compensation:re_second"
    assert compensation.idempotency_key == compensation.action_id
    assert compensation.kind == ActionKind.COMPENSATION
    assert compensation.status == S.PROPOSED
    assert compensation.payload == {
        "kind": "compensation",
        "compensates": original.action_id,
        "duplicate_refunds": ["re_second"],
        "discrepancy": duplicate.pk,
        "order": original.order.number,  # type: ignore[union-attr]
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "duplicate_charge",
        "schema_version": 1,
    }
    assert compensation.payload_hash == payload_hash(compensation.payload) != original.payload_hash
    assert "charge" not in compensation.payload, "nothing in it can be sent as a refund"
    assert (compensation.amount, compensation.currency) == (Decimal("40.00"), "EUR")
    assert compensation.proposed_by_user == admin_user
    event = ActionEvent.objects.get(action=compensation)
    assert (event.transition, event.from_state, event.to_state) == ("propose", "", S.PROPOSED)
    assert (event.actor_kind, event.actor_user) == (ActorKind.USER, admin_user)
    assert event.reason == "Invoice the customer for the second refund."
    assert event.evidence["compensates"] == original.action_id

    assert snapshot(original) == before
    duplicate.refresh_from_db()
    assert duplicate.status == DiscrepancyStatus.IN_PROGRESS
    assert duplicate.details["compensating_action"] == "compensation:re_second"
    assert duplicate.details["effects"] == ["re_first", "re_second"], "what the audit found stays"
    assert duplicate.owner is None, "finance takes it: the admin does not recover the money"
    assert "compensation:re_second" in duplicate.note


def test_starting_the_same_compensation_twice_returns_the_first_one(duplicate: Discrepancy, admin_user: Any) -> None:
    """Invariant 1 for corrections: one duplicate, one compensating action, however often it is asked for."""
    first = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_user, note="Invoice the customer.")
    second = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_user, note="Clicked twice.")

    assert second.pk == first.pk
    assert Action.objects.filter(kind=ActionKind.COMPENSATION).count() == 1
    assert ActionEvent.objects.filter(action=first).count() == 1


def test_a_compensation_needs_a_managers_approval_and_four_eyes_apply(
    duplicate: Discrepancy, admin_user: Any, manager: Any, settings: Any, published: list[int]
) -> None:
    """Invariant 10: the admin who proposed the compensation cannot approve it, even holding the
    manager's role; no auto-approval applies; another manager within limit can."""
    settings.AUTO_APPROVAL_ENABLED = True
    settings.AUTO_APPROVAL_THRESHOLDS = {"EUR": Decimal("1000")}
    admin_and_manager = make_user("max.admin", "admin", "manager", limits={"EUR": "500"}, is_staff=True)
    compensation = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_and_manager, note="Invoice it.")
    assert compensation.status == S.PROPOSED, "no policy approves a compensation"
    published.clear()

    with pytest.raises(DecisionRefused) as refusal:
        approval_decide(action_pk=compensation.pk, user=admin_and_manager, decision=Decision.APPROVE)
    assert refusal.value.code == "four_eyes"
    assert Action.objects.get(pk=compensation.pk).status == S.PROPOSED

    approval_decide(action_pk=compensation.pk, user=manager, decision=Decision.APPROVE)

    assert Action.objects.get(pk=compensation.pk).status == S.AUTHORIZED


@pytest.mark.django_db(transaction=True)
def test_an_approved_compensation_is_never_sent_to_the_refund_provider(
    duplicate: Discrepancy, admin_user: Any, manager: Any, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 1: recovering a duplicate refund is finance's manual step; the dispatcher must not
    turn the compensation into a third refund, nor reserve its amount on the order. It hands the
    compensation to finance (NEEDS_REVIEW with a named owner and a due time) instead."""

    def refund_send(self: Any, action: Action) -> Answer:
        raise AssertionError(f"{action.action_id} was sent to the refund provider")

    monkeypatch.setattr("actions.kinds.refund.contract.RefundReceiver.send", refund_send)
    compensation = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_user, note="Invoice it.")
    approval_decide(action_pk=compensation.pk, user=manager, decision=Decision.APPROVE)
    order = Order.objects.filter(actions=compensation)
    order_before = order.values("reserved_amount", "refunded_amount", "version").get()

    assert execution_dispatch(action_pk=compensation.pk) == S.NEEDS_REVIEW

    handed_over = Action.objects.get(pk=compensation.pk)
    assert handed_over.status == S.NEEDS_REVIEW
    assert handed_over.owner is not None and handed_over.due_at is not None
    assert order.values("reserved_amount", "refunded_amount", "version").get() == order_before


@pytest.mark.django_db(transaction=True)
def test_finance_records_the_recovery_and_the_compensation_succeeds(
    duplicate: Discrepancy, admin_user: Any, manager: Any, finance: Any
) -> None:
    """The compensation's real ending (no approved action is left without a way forward):
    finance records the recovery with its evidence, which books nothing on the order."""
    compensation = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_user, note="Invoice it.")
    approval_decide(action_pk=compensation.pk, user=manager, decision=Decision.APPROVE)
    order = Order.objects.filter(actions=compensation)
    order_before = order.values("reserved_amount", "refunded_amount", "version").get()
    execution_dispatch(action_pk=compensation.pk)

    resolution = action_resolve_succeeded(
        action_pk=compensation.pk,
        user=finance,
        provider_reference="INV-2026-0042",
        reason="The customer paid the recovery invoice.",
    )

    assert resolution.action.status == S.SUCCEEDED
    assert Action.objects.get(pk=compensation.pk).provider_reference == "INV-2026-0042"
    assert order.values("reserved_amount", "refunded_amount", "version").get() == order_before
    # Its receiver is a person and keeps no ledger: invariant 2 counts no effect for it, while
    # the refund it compensates is still checked against the provider's ledger.
    violations = check_effects(ledger=[]).violations
    assert [v.subject for v in violations if v.invariant == 2] == [duplicate.action.action_id]  # type: ignore[union-attr]


def test_a_compensation_recovers_every_duplicate_in_the_currencys_own_decimals(
    agent_actor: Actor, manager: Any, admin_user: Any
) -> None:
    """Three refunds for one action: the two extra ones are recovered, named after the first of them."""
    original = succeeded_refund(agent_actor, manager, reference="re_a", amount="1500", currency="JPY")
    discrepancy = duplicate_found(original, "re_c", "re_b")

    compensation = discrepancy_compensate(discrepancy_pk=discrepancy.pk, user=admin_user, note="Invoice both.")

    assert compensation.action_id == "compensation:re_b"
    assert compensation.payload["duplicate_refunds"] == ["re_b", "re_c"]
    assert compensation.payload["amount"] == "3000"
    assert compensation.amount == Decimal("3000")


@pytest.mark.parametrize("role", ["manager", "finance"])
def test_only_an_admin_may_start_a_compensation(duplicate: Discrepancy, role: str) -> None:
    """Invariant 10: only admins correct; a refused correction writes nothing."""
    someone = make_user(f"someone.{role}", role, limits={"EUR": "500"}, is_staff=True)

    with pytest.raises(CorrectionRefused) as refusal:
        discrepancy_compensate(discrepancy_pk=duplicate.pk, user=someone, note="Let me fix this.")

    assert (refusal.value.code, refusal.value.status) == ("not_an_admin", 403)
    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists()
    duplicate.refresh_from_db()
    assert duplicate.status == DiscrepancyStatus.OPEN
    assert "compensating_action" not in duplicate.details


def test_a_compensation_needs_a_reason(duplicate: Discrepancy, admin_user: Any) -> None:
    with pytest.raises(CorrectionRefused) as refusal:
        discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin_user, note="  ")

    assert refusal.value.code == "reason_required"
    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists()


def test_only_a_duplicate_effect_is_compensated(agent_actor: Actor, manager: Any, admin_user: Any) -> None:
    original = succeeded_refund(agent_actor, manager)
    mismatch = Discrepancy.objects.create(
        kind=DiscrepancyKind.AMOUNT_MISMATCH, action=original, provider_reference="re_first", details={}
    )

    with pytest.raises(CorrectionRefused) as refusal:
        discrepancy_compensate(discrepancy_pk=mismatch.pk, user=admin_user, note="Invoice it.")

    assert refusal.value.code == "not_a_duplicate"
    assert not Action.objects.filter(kind=ActionKind.COMPENSATION).exists()


def test_a_duplicate_of_an_action_with_no_recorded_refund_is_resolved_first(
    agent_actor: Actor, manager: Any, admin_user: Any
) -> None:
    """Which of two refunds is the duplicate is only known once the original records one of them."""
    action = refund_of(agent_actor)
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.CLAIMED
    discrepancy = Discrepancy.objects.create(
        kind=DiscrepancyKind.DUPLICATE_EFFECT,
        action=action,
        provider_reference="re_x",
        details={"refunds": ["re_x", "re_y"], "count": 2},
    )

    with pytest.raises(CorrectionRefused) as refusal:
        discrepancy_compensate(discrepancy_pk=discrepancy.pk, user=admin_user, note="Invoice it.")

    assert refusal.value.code == "original_unresolved"
    assert "Resolve the original action first" in str(refusal.value)


# --- reassigning an owner --------------------------------------------------------------------


def needs_review(proposer: Actor, approver: Any) -> Action:
    """A refund whose submission a worker escalated to a person (through the worker's service)."""
    action = refund_of(proposer)
    approval_decide(action_pk=action.pk, user=approver, decision=Decision.APPROVE)
    assert submission_begin(action_pk=action.pk).outcome == ClaimOutcome.CLAIMED
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=action.pk)
        action_escalate(
            action=locked, actor=Actor.system("test"), now=timezone.now(), reason="The receiver is down.", evidence={}
        )
    return Action.objects.get(pk=action.pk)


def test_reassigning_an_owner_writes_an_audit_event_and_keeps_the_status(
    agent_actor: Actor, manager: Any, finance: Any, admin_user: Any
) -> None:
    """Invariant 9: the reassignment is in the trail, with who, from whom, to whom and why."""
    action = needs_review(agent_actor, manager)
    assert action.owner == finance
    fred = make_user("fred.finance", "finance")

    action_owner_assign(action_pk=action.pk, owner=fred, user=admin_user, reason="Fiona is on leave this week.")

    fresh = Action.objects.get(pk=action.pk)
    assert (fresh.owner, fresh.status) == (fred, S.NEEDS_REVIEW)
    event = ActionEvent.objects.filter(action=action).last()
    assert event is not None
    assert (event.transition, event.from_state, event.to_state) == ("assign_owner", S.NEEDS_REVIEW, S.NEEDS_REVIEW)
    assert event.actor_user == admin_user
    assert event.reason == "Fiona is on leave this week."
    assert event.evidence == {"previous_owner": "fiona.finance", "owner": "fred.finance"}


def test_an_owner_must_be_someone_who_may_resolve(agent_actor: Actor, manager: Any, admin_user: Any) -> None:
    action = needs_review(agent_actor, manager)
    events_before = ActionEvent.objects.filter(action=action).count()

    with pytest.raises(CorrectionRefused) as refusal:
        action_owner_assign(action_pk=action.pk, owner=manager, user=admin_user, reason="Maria knows this one.")

    assert refusal.value.code == "owner_cannot_resolve"
    assert ActionEvent.objects.filter(action=action).count() == events_before


def test_only_an_admin_may_reassign_an_owner(agent_actor: Actor, manager: Any, finance: Any) -> None:
    """Invariant 10: finance works the queue, but moving work between people is a correction."""
    action = needs_review(agent_actor, manager)
    fred = make_user("fred.finance", "finance")

    with pytest.raises(CorrectionRefused) as refusal:
        action_owner_assign(action_pk=action.pk, owner=fred, user=finance, reason="Fred, take this one.")

    assert refusal.value.code == "not_an_admin"
    assert Action.objects.get(pk=action.pk).owner == finance


def test_only_an_action_whose_effect_is_unresolved_has_an_owner_to_change(
    agent_actor: Actor, manager: Any, finance: Any, admin_user: Any
) -> None:
    action = succeeded_refund(agent_actor, manager)

    with pytest.raises(CorrectionRefused) as refusal:
        action_owner_assign(action_pk=action.pk, owner=finance, user=admin_user, reason="For the record.")

    assert refusal.value.code == "not_open"
    assert Action.objects.get(pk=action.pk).owner is None


def test_assigning_the_current_owner_again_writes_nothing(
    agent_actor: Actor, manager: Any, finance: Any, admin_user: Any
) -> None:
    action = needs_review(agent_actor, manager)
    events_before = ActionEvent.objects.filter(action=action).count()

    action_owner_assign(action_pk=action.pk, owner=finance, user=admin_user, reason="Double click.")

    assert ActionEvent.objects.filter(action=action).count() == events_before
