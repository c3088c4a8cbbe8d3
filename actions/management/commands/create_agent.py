"""Create an agent and print a new API token for it, for scripts and first set-up.

    manage.py create_agent support-bot --scopes refund --owner otto.owner

The token is printed once, alone on standard output (so that ``TOKEN=$(manage.py create_agent
...)`` works); everything else goes to standard error. Only its hash is stored: a lost token
is replaced with ``--new-token``, which issues another one for an existing agent.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.agents.services import AgentInvalid, agent_create, agent_token_issue
from actions.models import Agent


class Command(BaseCommand):
    help = "Create an agent with the given scopes and print a new API token (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The agent's unique name, e.g. support-bot.")
        parser.add_argument(
            "--scopes",
            default="",
            help="Comma-separated action kinds the agent may propose, e.g. 'refund'. Required for a new agent.",
        )
        parser.add_argument(
            "--owner",
            help="Username of the person accountable for the agent (four eyes treat its proposals as theirs). "
            "Defaults to the only superuser, if there is exactly one.",
        )
        parser.add_argument("--label", default="", help="A label for the token, e.g. 'production'.")
        parser.add_argument(
            "--new-token",
            action="store_true",
            help="The agent exists: issue it another token instead of failing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["name"]
        agent = Agent.objects.filter(name=name).first()
        if agent is not None:
            if not options["new_token"]:
                raise CommandError(f"The agent {name!r} exists. Use --new-token to issue it another token.")
        else:
            scopes = [scope for scope in options["scopes"].split(",") if scope.strip()]
            if not scopes:
                raise CommandError("Give the agent's scopes, e.g. --scopes refund.")
            try:
                agent = agent_create(name=name, owner=self._owner(options["owner"]), scopes=scopes)
            except AgentInvalid as invalid:
                raise CommandError(str(invalid)) from None
            self.stderr.write(f"Created agent {agent.name!r} owned by {agent.owner} with scopes {agent.scopes}.")
        issued = agent_token_issue(agent=agent, label=options["label"])
        self.stderr.write(
            f"Token {issued.token.prefix}… issued. It is shown once, below, and cannot be shown again: store it now."
        )
        self.stdout.write(issued.plain)

    def _owner(self, username: str | None) -> Any:
        users = get_user_model().objects
        if username:
            owner = users.filter(username=username).first()
            if owner is None:
                raise CommandError(f"There is no user {username!r}.")
            return owner
        superusers = list(users.filter(is_superuser=True)[:2])
        if len(superusers) != 1:
            raise CommandError("Give the agent's owner with --owner USERNAME.")
        return superusers[0]
