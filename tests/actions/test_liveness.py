"""audit_effects' liveness check (invariant 8): every non-final action has an owner, a due time
or a scheduled next step; a decision waiting for a person is due only if someone may make it."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from actions.engine.invariants import check_effects
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import Action, ActionStatus, Supplier, SupplierContact
from actions.services import Actor
from approvals.models import Approval, ApprovalPolicy, Decision
from tests.factories import make_order, make_request, make_user
from tests.mail import BILL_PARAMETERS

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def propose(actor: Actor, amount: str) -> Action:
    order = make_order(captured="500.00")
    return action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        proposer=actor,
    ).action


def liveness(report: Any) -> list[str]:
    return [v.message for v in report.violations if v.invariant == 8]


def test_a_proposal_a_manager_may_decide_is_a_decision_due_not_a_violation(agent_actor: Actor, manager: Any) -> None:
    propose(agent_actor, "79.00")

    report = check_effects(ledger=[])

    assert liveness(report) == []
    assert report.decisions_due == 1


def test_a_proposal_nobody_may_decide_is_reported(agent_actor: Actor, manager: Any) -> None:
    """The manager's limit is 500 EUR: nobody can ever decide 600 EUR."""
    order = make_order(captured="1000.00")
    action_propose_refund(
        order_number=order.number,
        request_number=make_request(order).number,
        amount="600.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    )

    (message,) = liveness(check_effects(ledger=[]))

    assert "no active user may decide 600.00 EUR" in message


def test_a_superuser_within_their_limit_may_decide_and_a_limit_alone_is_no_permission(agent_actor: Actor) -> None:
    make_user("nina.nobody", limits={"EUR": "1000"})
    propose(agent_actor, "79.00")
    assert len(liveness(check_effects(ledger=[]))) == 1

    make_user("sam.superuser", limits={"EUR": "1000"}, is_superuser=True)
    report = check_effects(ledger=[])
    assert liveness(report) == []
    assert report.decisions_due == 1


def test_a_proposal_with_no_manager_at_all_is_reported(agent_actor: Actor) -> None:
    propose(agent_actor, "79.00")

    assert len(liveness(check_effects(ledger=[]))) == 1


def test_a_stale_action_the_policy_approved_is_reported(agent_actor: Actor, manager: Any) -> None:
    action = propose(agent_actor, "10.00")
    assert Approval.objects.get(action=action).policy == ApprovalPolicy.AUTO
    Action.objects.filter(pk=action.pk).update(status=S.STALE)

    (message,) = liveness(check_effects(ledger=[]))

    assert "STALE after the policy's approval" in message


def test_a_stale_action_a_manager_approved_waits_for_a_managers_new_decision(agent_actor: Actor, manager: Any) -> None:
    action = propose(agent_actor, "79.00")
    Approval.objects.create(
        action=action,
        approver=manager,
        decided_by_label="maria.manager",
        policy=ApprovalPolicy.MANAGER,
        decision=Decision.APPROVE,
        decided_at=timezone.now(),
        expires_at=timezone.now(),
        order_version=1,
        amount=action.amount,
        currency=action.currency,
        payload_hash=action.payload_hash,
    )
    Action.objects.filter(pk=action.pk).update(status=S.STALE)

    report = check_effects(ledger=[])

    assert liveness(report) == []
    assert report.decisions_due == 1


@pytest.mark.parametrize("status", [S.UNKNOWN, S.SETTLING])
def test_an_action_waiting_on_the_receiver_with_no_reconciliation_due_is_reported(
    status: str, agent_actor: Actor, manager: Any
) -> None:
    action = propose(agent_actor, "10.00")
    Action.objects.filter(pk=action.pk).update(status=status, status_changed_at=timezone.now(), next_reconcile_at=None)

    (message,) = liveness(check_effects(ledger=[]))

    assert "no reconciliation due" in message


def test_an_email_waiting_for_a_decision_needs_a_manager_but_no_limit(agent_actor: Actor, manager: Any) -> None:
    """An email moves no money, so no approval limit applies (approvals.services): any active
    manager may decide it. Found when a workflow's step was proposed again after its plan's
    approval expired: the audit asked for a limit in no currency."""
    supplier = Supplier.objects.create(code="ACME", name="Acme Supplies")
    SupplierContact.objects.create(supplier=supplier, email="ap@acme.example", name="Accounts")
    supplier_email_propose(
        supplier="ACME",
        reference="bill-1042",
        template="bill_adjusted",
        parameters=BILL_PARAMETERS,
        to="ap@acme.example",
        proposer=agent_actor,
    )

    report = check_effects(ledger=[])
    assert liveness(report) == [] and report.decisions_due == 1

    type(manager).objects.filter(pk=manager.pk).update(is_active=False)
    (message,) = liveness(check_effects(ledger=[]))
    assert "no active user may decide it" in message


def test_a_proposal_only_its_agents_owner_could_decide_is_reported(agent_actor: Actor, manager: Any) -> None:
    """Four eyes: the owner of the proposing agent may not decide. If the only manager able to
    decide owns the agent, nobody ever will (found by an independent review of the liveness audit)."""
    agent = agent_actor.agent
    assert agent is not None
    agent.owner = manager
    agent.save(update_fields=["owner"])
    propose(agent_actor, "79.00")

    (message,) = liveness(check_effects(ledger=[]))
    assert "no active user may decide 79.00 EUR" in message

    make_user("mona.manager", "manager", limits={"EUR": "100"})
    assert liveness(check_effects(ledger=[])) == []
