"""The agent owner's page: only the owner sees an agent, its deliveries and its webhook."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from actions.agents.webhooks import webhook_set_by_owner
from actions.models import AgentWebhook, AgentWebhookDelivery, SecurityEvent
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.factories import PASSWORD, make_agent, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.outbox.webhook_publish", lambda pk, countdown=None: None)
    monkeypatch.setattr("actions.agents.webhooks.webhook_publish", lambda pk, countdown=None: None)


def _client(user: Any) -> Client:
    client = Client()
    client.login(username=user.username, password=PASSWORD)
    return client


def test_the_owner_sees_tokens_proposals_webhook_and_deliveries(agent: Any, agent_owner: Any) -> None:
    webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/hooks")
    action = propose(Actor.for_agent(agent))
    page = _client(agent_owner).get(f"/account/agents/{agent.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert action.action_id in html
    assert "action.proposed" in html
    assert "https://agent.example/hooks" in html
    # The secret is never on the page, only its prefix.
    hook = AgentWebhook.objects.get(agent=agent)
    assert hook.secret not in html and hook.secret_prefix in html
    assert f"/account/agents/{agent.pk}/" in _client(agent_owner).get("/account/").content.decode()


def test_no_one_else_sees_or_changes_an_owners_agent(
    agent: Any, agent_owner: Any, finance: Any, console_admin: Any, manager: Any
) -> None:
    webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/hooks")
    propose(Actor.for_agent(agent))
    delivery = AgentWebhookDelivery.objects.get(agent=agent)
    other_owner = make_user("olga.owner", "agent")
    make_agent(other_owner, name="other-bot")
    trail_before = SecurityEvent.objects.count()
    for person in (other_owner, finance, console_admin, manager):
        client = _client(person)
        assert client.get(f"/account/agents/{agent.pk}/").status_code == 404
        assert client.post(f"/account/agents/{agent.pk}/webhook", {"url": "https://evil.example/"}).status_code == 404
        assert client.post(f"/account/agents/{agent.pk}/webhook/rotate").status_code == 404
        assert client.post(f"/account/agents/{agent.pk}/webhook/disable").status_code == 404
        redeliver = f"/account/agents/{agent.pk}/deliveries/{delivery.pk}/redeliver"
        assert client.post(redeliver).status_code == 404
    assert AgentWebhook.objects.get(agent=agent).url == "https://agent.example/hooks"
    assert AgentWebhookDelivery.objects.filter(agent=agent).count() == 1
    assert SecurityEvent.objects.count() == trail_before
    # The other owner's own page does not list this agent's deliveries either.
    other_agent_pk = other_owner.agents.get().pk
    assert delivery.event_id not in _client(other_owner).get(f"/account/agents/{other_agent_pk}/").content.decode()
    # A delivery of this agent cannot be redelivered through the other owner's agent.
    assert (
        _client(other_owner).post(f"/account/agents/{other_agent_pk}/deliveries/{delivery.pk}/redeliver").status_code
        == 404
    )


def test_setting_a_url_shows_the_secret_once_and_a_bad_url_is_refused(agent: Any, agent_owner: Any) -> None:
    client = _client(agent_owner)
    bad = client.post(f"/account/agents/{agent.pk}/webhook", {"url": "javascript:alert(1)"})
    assert bad.status_code == 400 and "is not an http(s) URL" in bad.content.decode()
    assert not AgentWebhook.objects.filter(agent=agent).exists()

    first = client.post(f"/account/agents/{agent.pk}/webhook", {"url": "https://agent.example/hooks"})
    hook = AgentWebhook.objects.get(agent=agent)
    assert first.status_code == 200 and hook.secret in first.content.decode()
    assert hook.secret not in client.get(f"/account/agents/{agent.pk}/").content.decode()

    rotated = client.post(f"/account/agents/{agent.pk}/webhook/rotate")
    hook.refresh_from_db()
    assert rotated.status_code == 200 and hook.secret in rotated.content.decode()

    client.post(f"/account/agents/{agent.pk}/webhook/disable")
    hook.refresh_from_db()
    assert hook.is_active is False
    propose(Actor.for_agent(agent))
    assert not AgentWebhookDelivery.objects.filter(agent=agent).exists()


def test_redeliver_button_queues_the_event_again(agent: Any, agent_owner: Any) -> None:
    webhook_set_by_owner(agent=agent, user=agent_owner, url="https://agent.example/hooks")
    propose(Actor.for_agent(agent))
    delivery = AgentWebhookDelivery.objects.get(agent=agent)
    answer = _client(agent_owner).post(f"/account/agents/{agent.pk}/deliveries/{delivery.pk}/redeliver")
    assert answer.status_code == 302
    assert AgentWebhookDelivery.objects.filter(agent=agent, event_id=delivery.event_id).count() == 2


def test_revoking_from_the_agent_page_returns_there_and_keeps_the_trail(agent: Any, agent_owner: Any) -> None:
    from actions.agents.services import agent_token_issue_by_owner

    issued = agent_token_issue_by_owner(agent=agent, user=agent_owner, label="prod")
    page = f"/account/agents/{agent.pk}/"
    answer = _client(agent_owner).post(f"/account/agents/{agent.pk}/tokens/{issued.token.pk}/revoke", {"next": page})
    assert answer.status_code == 302 and answer["Location"] == page
    assert SecurityEvent.objects.filter(kind="token_revoked").exists()


def test_the_owners_home_page_lists_their_agents_and_no_one_elses(agent: Any, agent_owner: Any, finance: Any) -> None:
    propose(Actor.for_agent(agent))
    home = _client(agent_owner).get("/").content.decode()
    assert 'data-testid="home-agents"' in home
    assert f"/account/agents/{agent.pk}/" in home and "1 proposal waiting for a manager" in home
    assert 'data-testid="home-agents"' not in _client(finance).get("/").content.decode()
