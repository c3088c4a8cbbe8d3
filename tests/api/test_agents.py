"""Agents and tokens: issued once and stored hashed, revoked, rotated, and created by command."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from actions.agents.services import (
    AgentAuthenticationFailed,
    AgentInvalid,
    TokenNotActive,
    agent_authenticate,
    agent_create,
    agent_token_issue,
    agent_token_revoke,
    agent_token_rotate,
)
from actions.models import Action, Agent, AgentToken
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def test_a_token_is_returned_once_and_only_its_hash_and_prefix_are_stored(agent: Agent) -> None:
    issued = agent_token_issue(agent=agent, label="prod")

    row = AgentToken.objects.get(pk=issued.token.pk)
    assert row.token_hash == hashlib.sha256(issued.plain.encode()).hexdigest()
    assert issued.plain.startswith(row.prefix) and len(row.prefix) == 12
    stored = [str(value) for value in AgentToken.objects.filter(pk=row.pk).values().get().values()]
    assert issued.plain not in stored
    assert agent_authenticate(plain=issued.plain).pk == row.pk


def test_two_tokens_are_never_the_same(agent: Agent) -> None:
    assert len({agent_token_issue(agent=agent).plain for _ in range(20)}) == 20


def test_a_revoked_token_no_longer_authenticates_and_keeps_its_first_revocation_time(agent: Agent) -> None:
    issued = agent_token_issue(agent=agent)
    first = agent_token_revoke(token=issued.token).revoked_at
    again = agent_token_revoke(token=issued.token).revoked_at

    assert first is not None and again == first
    with pytest.raises(AgentAuthenticationFailed) as failed:
        agent_authenticate(plain=issued.plain)
    assert failed.value.code == "token_invalid"


def test_rotation_revokes_the_old_token_and_a_revoked_token_cannot_be_rotated(agent: Agent) -> None:
    old = agent_token_issue(agent=agent, label="ci")
    new = agent_token_rotate(token=old.token)

    assert AgentToken.objects.get(pk=old.token.pk).revoked_at is not None
    assert agent_authenticate(plain=new.plain).pk == new.token.pk
    with pytest.raises(TokenNotActive):
        agent_token_rotate(token=old.token)
    assert AgentToken.objects.filter(agent=agent, revoked_at__isnull=True).count() == 1


def test_an_agent_needs_known_scopes_an_owner_and_a_unique_name(agent_owner: Any) -> None:
    with pytest.raises(AgentInvalid, match="Unknown scope"):
        agent_create(name="x", owner=agent_owner, scopes=["refund", "launch_rockets"])
    with pytest.raises(AgentInvalid, match="owner"):
        agent_create(name="x", owner=None, scopes=["refund"])
    agent_create(name="x", owner=agent_owner, scopes=[" refund ", "refund"])
    assert Agent.objects.get(name="x").scopes == ["refund"]
    with pytest.raises(AgentInvalid, match="already"):
        agent_create(name="x", owner=agent_owner, scopes=["refund"])


def test_create_agent_prints_a_token_that_proposes_as_the_owner(agent_owner: Any) -> None:
    out, err = io.StringIO(), io.StringIO()

    call_command(
        "create_agent", "triage-bot", "--scopes", "refund", "--owner", agent_owner.username, stdout=out, stderr=err
    )

    token = out.getvalue().strip()
    assert "\n" not in token, "stdout carries the token alone, for scripts"
    authenticated = agent_authenticate(plain=token)
    assert authenticated.agent.name == "triage-bot"
    assert authenticated.agent.owner == agent_owner
    assert authenticated.agent.scopes == ["refund"]
    assert "shown once" in err.getvalue()
    assert Action.objects.count() == 0


def test_create_agent_refuses_an_existing_name_unless_asked_for_a_new_token(agent: Agent) -> None:
    with pytest.raises(CommandError, match="exists"):
        call_command("create_agent", agent.name, "--scopes", "refund", stdout=io.StringIO(), stderr=io.StringIO())

    out = io.StringIO()
    call_command("create_agent", agent.name, "--new-token", stdout=out, stderr=io.StringIO())

    assert agent_authenticate(plain=out.getvalue().strip()).agent == agent


def test_create_agent_defaults_the_owner_to_the_only_superuser_and_needs_scopes(db: Any) -> None:
    with pytest.raises(CommandError, match="--owner"):
        call_command("create_agent", "bot", "--scopes", "refund", stdout=io.StringIO(), stderr=io.StringIO())
    boss = make_user("sam.super", is_superuser=True)
    with pytest.raises(CommandError, match="scopes"):
        call_command("create_agent", "bot", stdout=io.StringIO(), stderr=io.StringIO())

    call_command("create_agent", "bot", "--scopes", "refund", stdout=io.StringIO(), stderr=io.StringIO())

    assert Agent.objects.get(name="bot").owner == boss
