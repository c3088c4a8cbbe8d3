from __future__ import annotations

from typing import TypeVar

from django.conf import settings
from django.db import models
from django.db.models import Q

_Request = TypeVar("_Request", bound=models.Model)


class Agent(models.Model):
    """A piece of software allowed to propose actions over the API.

    ``scopes`` lists the action kinds it may propose. The agent acts for its owner: four eyes
    treat a proposal by the agent as a proposal by the owner.
    """

    name = models.CharField(max_length=100, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agents")
    scopes = models.JSONField(default=list, blank=True, help_text='Action kinds it may propose, e.g. ["refund"].')
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def may_propose(self, kind: str) -> bool:
        return self.is_active and kind in self.scopes


class AgentOpenedQuerySet(models.QuerySet[_Request]):
    """Requests (refund or adjustment) that record which agent opened them, if one did."""

    def visible_to(self, agent: Agent | None) -> AgentOpenedQuerySet[_Request]:
        """The requests ``agent`` may read and propose against: the ones it opened and the ones
        no agent opened (from a ticket, the matcher or a person). Another agent's request is not
        among them, so that it reads as no request at all. With no agent (a person or the
        system acting), every request."""
        if agent is None:
            return self
        return self.filter(Q(opened_by_agent__isnull=True) | Q(opened_by_agent=agent))


class AgentToken(models.Model):
    """An API token. Only its SHA-256 is stored; the token itself is shown once at creation."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    label = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True, help_text="The token's first characters, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.agent.name} {self.prefix}…"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
