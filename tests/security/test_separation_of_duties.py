"""Findings 2, 3, 4 and 10: what an admin can no longer do alone.

The attack of finding 2: an admin created an agent, issued it a token in the admin site and
proposed a refund that the auto-approval policy paid. Finding 3: the admin re-owned an agent so
that its owner could approve her own agent's proposal. Finding 4: the admin closed finance's
follow-ups. Finding 10: approval limits took negative amounts and lowercase currencies, and an
admin could raise his own (invariant 10).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.test import Client

from actions.agents.services import (
    AgentChangeRefused,
    AgentInvalid,
    agent_authenticate,
    agent_create,
    agent_owner_change,
)
from actions.models import (
    ActionEvent,
    ActionStatus,
    AgentToken,
    Discrepancy,
    DiscrepancyKind,
    Order,
    Remedy,
    SecurityEvent,
    SecurityEventKind,
)
from actions.services import Actor
from approvals.four_eyes import four_eyes_refusal
from approvals.models import ApprovalLimit, PolicyChange
from approvals.services import DecisionRefused, approval_decide
from tests.factories import PASSWORD, make_order, make_user
from tests.security.conftest import propose

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- finding 2: tokens ------------------------------------------------------------------------


def test_the_admin_site_cannot_issue_or_rotate_an_agent_token(console_admin: Any, agent: Any) -> None:
    client = logged_in(console_admin)

    listing = client.get("/admin/actions/agent/")
    issued = client.post(
        "/admin/actions/agent/", {"action": "issue_token", "_selected_action": [agent.pk]}, follow=True
    )
    token_list = client.get("/admin/actions/agenttoken/")

    assert listing.status_code == 200
    assert b"issue_token" not in listing.content
    assert b"rotate" not in token_list.content
    assert issued.status_code == 200
    assert AgentToken.objects.filter(agent=agent).count() == 0
    assert b"ect_" not in issued.content


def test_an_admin_may_not_own_an_agent_so_cannot_mint_his_own_proposer(console_admin: Any) -> None:
    with pytest.raises(AgentInvalid, match="admin"):
        agent_create(name="admins-bot", owner=console_admin, scopes=["refund"])

    response = logged_in(console_admin).post(
        "/admin/actions/agent/add/", {"name": "admins-bot", "owner": console_admin.pk, "scopes": ["refund"]}
    )
    assert response.status_code == 200  # the form again, with the error
    assert b"may not own an agent" in response.content


def test_only_the_owner_issues_a_token_shown_once_and_the_issuing_is_audited(
    agent: Any, agent_owner: Any, console_admin: Any
) -> None:
    url = f"/account/agents/{agent.pk}/tokens"

    as_admin = logged_in(console_admin).post(url, {"label": "stolen"})
    as_owner = logged_in(agent_owner).post(url, {"label": "production"})
    page_again = logged_in(agent_owner).get("/account/")

    assert as_admin.status_code == 404
    assert as_owner.status_code == 200
    plain = as_owner.context["plain"]
    assert agent_authenticate(plain=plain).agent == agent
    assert plain not in page_again.content.decode()
    event = SecurityEvent.objects.get(kind=SecurityEventKind.TOKEN_ISSUED)
    assert event.actor == agent_owner
    assert plain not in str(event.detail)
    assert AgentToken.objects.filter(agent=agent).count() == 1


# --- finding 3: four eyes survive an owner change --------------------------------------------


def test_an_agents_owner_cannot_change_while_its_proposal_waits(agent: Any, manager: Any, console_admin: Any) -> None:
    waiting = propose(Actor.for_agent(agent), amount="120.00")
    assert waiting.status == ActionStatus.PROPOSED

    with pytest.raises(AgentChangeRefused) as refused:
        agent_owner_change(agent=agent, owner=manager, user=console_admin, reason="handover")
    response = logged_in(console_admin).post(
        f"/admin/actions/agent/{agent.pk}/change/",
        {
            "name": agent.name,
            "owner": manager.pk,
            "scopes": ["refund"],
            "is_active": "on",
            "owner_change_reason": "handover",
            "tokens-TOTAL_FORMS": "0",
            "tokens-INITIAL_FORMS": "0",
        },
    )

    assert refused.value.code == "live_actions"
    assert response.status_code == 200 and b"cannot change" in response.content
    agent.refresh_from_db()
    assert agent.owner != manager


def test_four_eyes_compare_the_approver_with_the_owner_then_and_now(agent: Any, agent_owner: Any, manager: Any) -> None:
    action = propose(Actor.for_agent(agent))
    assert four_eyes_refusal(action=action, user=agent_owner) is not None  # proposer of record
    assert four_eyes_refusal(action=action, user=manager) is None

    # Had the owner changed (the service refuses it while the action waits; a direct write
    # stands in for a path that forgot), the new owner is still refused.
    type(agent).objects.filter(pk=agent.pk).update(owner=manager)
    action.refresh_from_db()
    assert four_eyes_refusal(action=action, user=manager) is not None
    assert four_eyes_refusal(action=action, user=agent_owner) is not None


def test_an_owner_change_revokes_tokens_and_is_written_to_open_actions_trails(
    agent: Any, agent_owner: Any, console_admin: Any, finance: Any
) -> None:
    other_owner = make_user("olga.owner", "agent")
    in_flight = propose(Actor.for_agent(agent))
    # An action whose effect is unresolved does not block the change, but its trail shows it.
    type(in_flight).objects.filter(pk=in_flight.pk).update(status=ActionStatus.NEEDS_REVIEW)
    AgentToken.objects.create(agent=agent, prefix="ect_x", token_hash="0" * 64)

    agent_owner_change(agent=agent, owner=other_owner, user=console_admin, reason="Otto left the team.")

    event = ActionEvent.objects.get(action=in_flight, transition="agent_owner_changed")
    assert event.evidence["previous_owner"] == agent_owner.username
    assert event.actor_user == console_admin
    assert not AgentToken.objects.filter(agent=agent, revoked_at__isnull=True).exists()
    assert SecurityEvent.objects.filter(kind=SecurityEventKind.AGENT_OWNER_CHANGED).count() == 1


# --- finding 4: follow-ups --------------------------------------------------------------------


def test_an_admin_cannot_close_a_remedy_or_explain_a_discrepancy(console_admin: Any, agent: Any) -> None:
    action = propose(Actor.for_agent(agent))
    remedy = Remedy.objects.create(action=action, amount=Decimal("10.00"), currency="EUR")
    discrepancy = Discrepancy.objects.create(
        kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_orphan", details={}
    )
    client = logged_in(console_admin)

    remedy_answer = client.post(f"/review/remedies/{remedy.pk}/advance", {"status": "done", "note": "closed"})
    discrepancy_answer = client.post(
        f"/review/discrepancies/{discrepancy.pk}/advance", {"status": "explained", "note": "fine"}
    )

    assert remedy_answer.status_code == 403
    assert discrepancy_answer.status_code == 403
    remedy.refresh_from_db()
    discrepancy.refresh_from_db()
    assert remedy.status != "done"
    assert discrepancy.status == "open"
    assert not console_admin.has_perm("actions.change_remedy")


# --- finding 2 (orders) -----------------------------------------------------------------------


def test_an_admin_cannot_create_orders_in_production_mode(console_admin: Any, settings: Any) -> None:
    settings.ADMIN_MAY_CREATE_ORDERS = False
    response = logged_in(console_admin).post(
        "/admin/actions/order/add/",
        {
            "number": "9001",
            "customer_name": "Mallory",
            "currency": "EUR",
            "captured_amount": "500.00",
            "paid_at_0": "2026-11-30",
            "paid_at_1": "10:00:00",
            "charge_reference": "ch_new",
        },
    )
    assert response.status_code == 403
    assert not Order.objects.filter(number="9001").exists()


def test_two_orders_cannot_share_a_charge(db: Any) -> None:
    first, second = make_order(number="7001"), make_order(number="7002")
    Order.objects.filter(pk=first.pk).update(charge_reference="ch_refunded_already")
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=second.pk).update(charge_reference="ch_refunded_already")
    # Orders without a charge reference are not affected.
    assert Order.objects.filter(pk__in=[first.pk, second.pk]).update(charge_reference="") == 2


# --- finding 10: approval limits --------------------------------------------------------------


def test_approval_limits_must_be_positive_in_an_iso_currency(console_admin: Any, manager: Any) -> None:
    client = logged_in(console_admin)
    other = make_user("mia.manager", "manager")

    negative = client.post(
        "/admin/approvals/approvallimit/add/", {"user": other.pk, "currency": "EUR", "max_amount": "-5"}
    )
    lowercase = client.post(
        "/admin/approvals/approvallimit/add/", {"user": other.pk, "currency": "eur", "max_amount": "5"}
    )

    assert negative.status_code == 200 and lowercase.status_code == 200  # the form again, with errors
    assert not ApprovalLimit.objects.filter(user=other).exists()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApprovalLimit.objects.create(user=other, currency="EUR", max_amount=Decimal("-1"))


def test_an_admin_cannot_raise_his_own_limit_and_changes_are_audited(console_admin: Any, manager: Any) -> None:
    own = ApprovalLimit.objects.create(user=console_admin, currency="EUR", max_amount=Decimal("10"))
    client = logged_in(console_admin)

    own_change = client.post(f"/admin/approvals/approvallimit/{own.pk}/change/", {"max_amount": "1000000"})
    theirs = ApprovalLimit.objects.get(user=manager, currency="EUR")
    their_change = client.post(f"/admin/approvals/approvallimit/{theirs.pk}/change/", {"max_amount": "750"})

    own.refresh_from_db()
    theirs.refresh_from_db()
    assert own_change.status_code == 403
    assert own.max_amount == Decimal("10")
    assert their_change.status_code == 302
    # A change waits for a second person in finance (tests/approvals/test_policy_changes.py).
    assert theirs.max_amount == Decimal("500")
    proposed = SecurityEvent.objects.get(kind=SecurityEventKind.POLICY_CHANGE_PROPOSED)
    assert proposed.actor == console_admin
    assert proposed.detail["user"] == manager.username
    assert proposed.detail["before"] == {"max_amount": "500.00"}
    assert proposed.detail["after"] == {"max_amount": "750.00"}

    change = PolicyChange.objects.get()
    logged_in(make_user("fiona.finance", "finance")).post(f"/approvals/policy-changes/{change.pk}/confirm")
    theirs.refresh_from_db()
    assert theirs.max_amount == Decimal("750")
    confirmed = SecurityEvent.objects.get(kind=SecurityEventKind.POLICY_CHANGE_CONFIRMED)
    assert confirmed.detail["before"] == {"max_amount": "500.00"}
    assert confirmed.detail["after"] == {"max_amount": "750.00"}


def test_the_password_of_every_persona_is_known_to_the_tests() -> None:
    # Guards the helper above: personas log in with this password in the login tests.
    assert PASSWORD


def test_the_admin_changes_an_idle_agents_owner_through_the_audited_service(agent: Any, console_admin: Any) -> None:
    new_owner = make_user("olga.owner", "agent")
    AgentToken.objects.create(agent=agent, prefix="ect_y", token_hash="1" * 64)

    response = logged_in(console_admin).post(
        f"/admin/actions/agent/{agent.pk}/change/",
        {
            "name": agent.name,
            "owner": new_owner.pk,
            "scopes": ["refund"],
            "is_active": "on",
            "owner_change_reason": "Otto moved to another team.",
            "tokens-TOTAL_FORMS": "0",
            "tokens-INITIAL_FORMS": "0",
        },
    )

    assert response.status_code == 302
    agent.refresh_from_db()
    assert agent.owner == new_owner
    assert not AgentToken.objects.filter(agent=agent, revoked_at__isnull=True).exists()
    event = SecurityEvent.objects.get(kind=SecurityEventKind.AGENT_OWNER_CHANGED)
    assert event.detail["reason"] == "Otto moved to another team."


def test_the_current_owner_of_the_proposing_agent_cannot_approve_its_proposal(agent: Any, manager: Any) -> None:
    action = propose(Actor.for_agent(agent))
    # An owner change that bypassed the service (which refuses it while the action waits).
    type(agent).objects.filter(pk=agent.pk).update(owner=manager)

    with pytest.raises(DecisionRefused):
        approval_decide(action_pk=action.pk, user=manager, decision="approve")
