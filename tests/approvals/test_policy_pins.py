"""approvals.policy's reads and the group version chain, pinned where mutation testing found
nothing that would notice a change (tests/MUTATION.md): which approval is in force, which rows
the claim's read locks and skips, and that a grouped reservation advances only its own group's
chain, only from the version it expects. PostgreSQL: the locks are the point."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action
from actions.services import Actor
from approvals.models import Approval, ApprovalGroup, ApprovalPolicy, Decision
from approvals.policy import group_chain_advance, latest_approval_with_locked_action
from tests.factories import make_order, make_request

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def authorized(actor: Actor, amount: str = "20.00") -> Action:
    order = make_order(captured="100.00")
    return action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=actor,
    ).action


@pytest.fixture
def other_session() -> Iterator[psycopg.Connection[Any]]:
    """A second connection to the test database, holding row locks in its own transaction."""
    settings = connection.settings_dict
    other = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
    )
    yield other
    other.rollback()
    other.close()


def test_the_approval_in_force_for_the_claim_is_the_newest_approve_row(agent_actor: Actor, manager: Any) -> None:
    action = authorized(agent_actor)
    in_force = Approval.objects.get(action=action, decision=Decision.APPROVE)
    Approval.objects.create(
        action=action,
        approver=manager,
        decided_by_label=manager.get_username(),
        policy=ApprovalPolicy.MANAGER,
        decision=Decision.REJECT,
        decided_at=timezone.now(),
        amount=in_force.amount,
        currency=in_force.currency,
    )
    with transaction.atomic():
        found = latest_approval_with_locked_action(action_pk=action.pk)
    assert found == in_force and found.action.pk == action.pk


def test_with_skip_locked_an_action_another_worker_holds_is_skipped_at_once(
    agent_actor: Actor, other_session: psycopg.Connection[Any]
) -> None:
    action = authorized(agent_actor)
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [action.pk])
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '3s'")  # a wait instead of a skip fails here
        assert latest_approval_with_locked_action(action_pk=action.pk, skip_locked=True) is None


def test_the_claims_read_locks_the_action_and_not_its_approval(
    agent_actor: Actor, other_session: psycopg.Connection[Any]
) -> None:
    """A row lock on the approval (an admin reading it FOR UPDATE, say) does not hide the action
    from a claim that skips locked rows: only the action's row is the claim's to lock."""
    action = authorized(agent_actor)
    approval = Approval.objects.get(action=action, decision=Decision.APPROVE)
    other_session.execute("SELECT id FROM approvals_approval WHERE id = %s FOR UPDATE", [approval.pk])
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '3s'")
        assert latest_approval_with_locked_action(action_pk=action.pk, skip_locked=True) == approval


def _group(manager: Any, version: int) -> ApprovalGroup:
    return ApprovalGroup.objects.create(
        approver=manager,
        decided_at=timezone.now() - timedelta(minutes=1),
        approved_version=version,
        next_version=version,
        size=2,
        total_amount=Decimal("30.00"),
        currency="EUR",
    )


def test_a_grouped_reservation_advances_its_own_groups_chain_only(agent_actor: Actor, manager: Any) -> None:
    action = authorized(agent_actor)
    mine, other = _group(manager, 3), _group(manager, 3)
    approval = Approval.objects.get(action=action, decision=Decision.APPROVE)
    Approval.objects.filter(pk=approval.pk).update(group=mine)
    approval.refresh_from_db()

    with transaction.atomic():
        group_chain_advance(approval, reserved_at=3)

    assert ApprovalGroup.objects.get(pk=mine.pk).next_version == 4
    assert ApprovalGroup.objects.get(pk=other.pk).next_version == 3


def test_a_grouped_reservation_at_a_version_the_chain_does_not_expect_is_refused_loudly(
    agent_actor: Actor, manager: Any
) -> None:
    action = authorized(agent_actor)
    group = _group(manager, 3)
    approval = Approval.objects.get(action=action, decision=Decision.APPROVE)
    Approval.objects.filter(pk=approval.pk).update(group=group)
    approval.refresh_from_db()

    with (
        pytest.raises(AssertionError, match=r"^the group's version chain moved under its lock$"),
        transaction.atomic(),
    ):
        group_chain_advance(approval, reserved_at=5)
    assert ApprovalGroup.objects.get(pk=group.pk).next_version == 3


def test_a_managers_approval_is_recorded_at_the_decisions_time_with_its_note_or_a_plain_word(
    agent_owner: Any, manager: Any, settings: Any
) -> None:
    """The 'approve' event and the state change carry the decision's own time, not the clock's,
    and its reason is the manager's note, or "Approved." without one."""
    from approvals.services import approval_decide

    settings.AUTO_APPROVAL_ENABLED = False
    proposer = Actor.for_user(agent_owner)
    decided_at = timezone.now() - timedelta(minutes=5)
    silent, noted = authorized(proposer), authorized(proposer)
    assert silent.status == noted.status == "PROPOSED"

    approval_decide(action_pk=silent.pk, user=manager, decision=Decision.APPROVE, now=decided_at)
    approval_decide(action_pk=noted.pk, user=manager, decision=Decision.APPROVE, note="Checked the photos.")

    silent.refresh_from_db()
    event = silent.events.get(transition="approve")
    assert (event.created_at, silent.status_changed_at, event.reason) == (decided_at, decided_at, "Approved.")
    assert noted.events.get(transition="approve").reason == "Checked the photos."
    # The event's evidence is what the approval binds, in the words the trail and the exports read.
    approval = Approval.objects.get(action=silent, decision=Decision.APPROVE)
    assert event.evidence == {
        "approval_id": approval.pk,
        "policy": ApprovalPolicy.MANAGER,
        "binding": {
            "order_version": approval.order_version,
            "amount": "20.00",
            "currency": "EUR",
            "payload_hash": silent.payload_hash,
        },
        "expires_at": (decided_at + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)).isoformat(),
    }
