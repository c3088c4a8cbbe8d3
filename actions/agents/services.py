"""Agents and their API tokens: creation, issue, revocation, rotation and authentication.

A token is shown once, when it is issued, and only its SHA-256 is stored. The token carries
256 bits from ``secrets``, so a fast unsalted hash is enough: there is nothing to brute-force
that a slow password hash would protect, and a fast hash keeps the lookup a single indexed
query on every API request.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from actions.foundation.security import CORRECT_PERMISSION, security_event_record
from actions.foundation.trail import Actor, event_record
from actions.kinds import all_kinds
from actions.models import Action, ActionKind, ActorKind, Agent, AgentToken, SecurityEventKind
from actions.models.actions import UNRESOLVED_STATUSES, ActionStatus

# Recognisable in logs, config files and secret scanners ("effect console token").
TOKEN_MARKER = "ect_"  # noqa: S105 (a public marker, not a secret)
# The stored prefix: the marker and eight random characters, enough to tell tokens apart in
# the admin without weakening the secret (the other 35 characters stay unknown).
PREFIX_LENGTH = len(TOKEN_MARKER) + 8
# last_used_at is written at most this often per token, so that an agent polling every second
# does not turn every read into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class AgentInvalid(ValueError):
    """Bad input for an agent (name, scopes, owner). Nothing was written."""


class TokenNotActive(Exception):
    """The token was already revoked (or replaced by a rotation)."""


class AgentChangeRefused(Exception):
    """A change to an agent or its tokens that separation of duties forbids. Nothing was written."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# An agent's owner may not be changed while it has actions in these statuses: a decision on
# them is pending (or was given) against the owner recorded at proposal time, and four eyes
# must not be re-aimed under a manager's feet.
OWNER_CHANGE_BLOCKING_STATUSES = frozenset({ActionStatus.PROPOSED, ActionStatus.AUTHORIZED, ActionStatus.STALE})


class AgentAuthenticationFailed(Exception):
    """The presented token does not identify an active agent.

    ``code`` is machine-readable: ``token_invalid`` (unknown, revoked or rotated away: the
    same answer for all three, so a guesser learns nothing) or ``agent_inactive`` (the token
    is right but the agent was switched off by a person).
    """

    def __init__(self, code: str, message: str, *, agent: Agent | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.agent = agent


@dataclass(frozen=True)
class IssuedToken:
    token: AgentToken
    # The secret itself. It exists only in this object: show it once and drop it.
    plain: str


def token_hash(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


# What an agent may do: propose actions of a kind (compensations are started by people, admins,
# never by agents), or, with ORDERS_SCOPE, feed the shop's orders in (a commerce system's
# integration, which proposes nothing).
ORDERS_SCOPE = "orders"
# Proposes invoice adjustments (credit notes against supplier bills).
INVOICE_ADJUSTMENT_SCOPE = "invoice_adjustment"
# The scope an agent needs to propose an action of each kind. The scopes are named after the
# kinds, except the adjustments'; a customer notice rides on the refund it announces. A kind
# missing here (a compensation, a void) is started by people only.
SCOPE_FOR_KIND = {
    ActionKind.REFUND.value: ActionKind.REFUND.value,
    ActionKind.CUSTOMER_EMAIL.value: ActionKind.REFUND.value,
    ActionKind.INVOICE_ADJUSTMENT.value: INVOICE_ADJUSTMENT_SCOPE,
    ActionKind.SUPPLIER_EMAIL.value: ActionKind.SUPPLIER_EMAIL.value,
}
# Scopes that name no kind.
OTHER_SCOPES = {ORDERS_SCOPE: "Orders (send the shop's orders)"}


def agent_scope_choices() -> list[tuple[str, str]]:
    """Every scope an agent may hold, with a label for people: one per registered kind that
    agents propose (from the kinds registry), plus the scopes that name no kind. The admin's
    form offers exactly these and ``agent_create`` accepts exactly these, so a stored scope is
    always shown, ticked, and kept when the form is saved."""
    labels: dict[str, list[str]] = {}
    for kind in all_kinds():
        scope = SCOPE_FOR_KIND.get(kind.name)
        if scope is not None:
            names = labels.setdefault(scope, [])
            # The kind the scope is named after comes first: "Refund and Customer email".
            names.insert(0 if kind.name == scope else len(names), kind.label)
    choices = [(scope, " and ".join(names)) for scope, names in labels.items()]
    choices += list(OTHER_SCOPES.items())
    return sorted(choices)


def _clean_scopes(scopes: Sequence[str]) -> list[str]:
    cleaned = sorted({scope.strip() for scope in scopes if scope.strip()})
    known = [scope for scope, _ in agent_scope_choices()]
    unknown = [scope for scope in cleaned if scope not in known]
    if unknown:
        raise AgentInvalid(
            f"Unknown scope {', '.join(unknown)}. A scope is an action kind agents may propose, or "
            f"{ORDERS_SCOPE!r} to send orders: {', '.join(known)}."
        )
    return cleaned


def agent_owner_refusal(owner: Any) -> str | None:
    """Why ``owner`` may not own an agent, or None.

    A person in the admin role may not: admins create and correct agents, and an agent of
    their own would let them propose refunds that the auto-approval policy pays with no other
    person involved. A superuser may (create_agent defaults to one): a superuser can already
    change any role, so no rule here could separate their duties; give them agents only where
    the deployment has no other accountable person.
    """
    if owner is None or getattr(owner, "pk", None) is None:
        return "An agent needs an owner: the person accountable for what it proposes."
    if not owner.is_active:
        return f"{owner.get_username()} is deactivated and cannot be accountable for an agent."
    if not owner.is_superuser and owner.has_perm(CORRECT_PERMISSION):
        return (
            f"{owner.get_username()} is an admin. Admins correct the console and may not own an agent "
            "(separation of duties): choose the person accountable for the agent's proposals."
        )
    return None


def agent_create(*, name: str, owner: Any, scopes: Sequence[str], is_active: bool = True) -> Agent:
    """Create an agent acting for ``owner``. Four eyes treat its proposals as the owner's."""
    name = name.strip()
    if not name or len(name) > 100:
        raise AgentInvalid("An agent needs a name of 1 to 100 characters.")
    refusal = agent_owner_refusal(owner)
    if refusal:
        raise AgentInvalid(refusal)
    cleaned = _clean_scopes(scopes)
    with transaction.atomic():
        if Agent.objects.filter(name=name).exists():
            raise AgentInvalid(f"There is already an agent called {name!r}.")
        return Agent.objects.create(name=name, owner=owner, scopes=cleaned, is_active=is_active)


def agent_token_issue(*, agent: Agent, label: str = "") -> IssuedToken:
    """Issue a new token for ``agent``. The returned ``plain`` token is never stored.

    The building block, for operators' commands (create_agent, seed_demo) run with shell
    access. People in the console go through ``agent_token_issue_by_owner``.
    """
    plain = TOKEN_MARKER + secrets.token_urlsafe(32)
    token = AgentToken.objects.create(
        agent=agent,
        label=label.strip()[:100],
        prefix=plain[:PREFIX_LENGTH],
        token_hash=token_hash(plain),
    )
    return IssuedToken(token=token, plain=plain)


def agent_token_revoke(*, token: AgentToken, now: datetime | None = None) -> AgentToken:
    """Revoke a token at once. Revoking a revoked token keeps its first revocation time."""
    now = now or timezone.now()
    AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    token.refresh_from_db(fields=["revoked_at"])
    return token


def agent_token_rotate(*, token: AgentToken, label: str | None = None, now: datetime | None = None) -> IssuedToken:
    """Replace a token: the old one stops working now and a new one is issued, in one commit.

    The row lock makes two concurrent rotations of the same token produce one new token, not
    two live ones: the second waits, then finds the token revoked and refuses.
    """
    now = now or timezone.now()
    with transaction.atomic():
        current = AgentToken.objects.select_for_update().select_related("agent").get(pk=token.pk)
        if current.revoked_at is not None:
            raise TokenNotActive(f"Token {current.prefix}… was revoked at {current.revoked_at:%Y-%m-%d %H:%M:%S}.")
        current.revoked_at = now
        current.save(update_fields=["revoked_at"])
        issued = agent_token_issue(agent=current.agent, label=current.label if label is None else label)
    token.revoked_at = now
    return issued


def _require_owner(*, agent: Agent, user: Any) -> None:
    if user is None or not user.is_authenticated or not user.is_active or agent.owner_id != user.pk:
        raise AgentChangeRefused(
            f"Only the owner of {agent.name!r} may issue or rotate its tokens: the owner is accountable for "
            "everything it proposes.",
            code="not_owner",
        )
    refusal = agent_owner_refusal(user)
    if refusal:
        raise AgentChangeRefused(refusal, code="owner_is_admin")


def agent_token_issue_by_owner(*, agent: Agent, user: Any, label: str = "") -> IssuedToken:
    """The agent's owner issues a token for it, recorded in the security trail (never the token)."""
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().get(pk=agent.pk)
        _require_owner(agent=agent, user=user)
        issued = agent_token_issue(agent=agent, label=label)
        security_event_record(
            kind=SecurityEventKind.TOKEN_ISSUED,
            user=user,
            subject=f"agent {agent.name}",
            detail={"agent": agent.name, "prefix": issued.token.prefix, "label": issued.token.label},
        )
    return issued


def agent_token_rotate_by_owner(*, token: AgentToken, user: Any) -> IssuedToken:
    """The agent's owner replaces a token; recorded in the security trail."""
    with transaction.atomic(durable=True):
        _require_owner(agent=token.agent, user=user)
        issued = agent_token_rotate(token=token)
        security_event_record(
            kind=SecurityEventKind.TOKEN_ROTATED,
            user=user,
            subject=f"agent {token.agent.name}",
            detail={"agent": token.agent.name, "old_prefix": token.prefix, "prefix": issued.token.prefix},
        )
    return issued


def agent_token_revoke_by(*, token: AgentToken, user: Any) -> AgentToken:
    """Revoke a token: the owner or an admin may (stopping an agent is always allowed)."""
    with transaction.atomic():
        was_active = token.revoked_at is None
        agent_token_revoke(token=token)
        if was_active:
            security_event_record(
                kind=SecurityEventKind.TOKEN_REVOKED,
                user=user,
                subject=f"agent {token.agent.name}",
                detail={"agent": token.agent.name, "prefix": token.prefix},
            )
    return token


def agent_owner_change(*, agent: Agent, owner: Any, user: Any, reason: str = "") -> Agent:
    """Give an agent a new owner.

    - Refused while the agent has a proposal awaiting a decision or approved and not yet sent:
      four eyes were checked (or will be) against the owner at proposal time.
    - Its tokens are revoked: they were issued by the previous owner, and the new owner issues
      their own, so that every token has an accountable issuer.
    - The change is written to the security trail and to the trail of each of the agent's
      actions whose effect is still unresolved.
    """
    refusal = agent_owner_refusal(owner)
    if refusal:
        raise AgentChangeRefused(refusal, code="owner_invalid")
    now = timezone.now()
    # Not durable: the admin's change form runs it inside its own transaction.
    with transaction.atomic():
        agent = Agent.objects.select_for_update().select_related("owner").get(pk=agent.pk)
        if agent.owner_id == owner.pk:
            return agent
        live = list(
            Action.objects.filter(proposed_by_agent=agent, status__in=OWNER_CHANGE_BLOCKING_STATUSES)
            .order_by("pk")
            .values_list("action_id", flat=True)[:5]
        )
        if live:
            raise AgentChangeRefused(
                f"{agent.name} has actions awaiting a decision or approved and not yet sent ({', '.join(live)}"
                f"{', ...' if len(live) == 5 else ''}). Their four-eyes check is bound to the current owner: wait "
                "until they are decided and sent, or cancel them, then change the owner.",
                code="live_actions",
            )
        previous = agent.owner.get_username()
        agent.owner = owner
        agent.save(update_fields=["owner"])
        revoked = AgentToken.objects.filter(agent=agent, revoked_at__isnull=True).update(revoked_at=now)
        label = user.get_username() if user is not None else "system"
        evidence = {"agent": agent.name, "previous_owner": previous, "owner": owner.get_username()}
        # Locked, as every writer of an action's trail holds its row (actions.foundation.trail,
        # events_chain); in key order, as the batched writers lock them.
        actor = Actor(kind=ActorKind.USER, label=label, user=user)
        unresolved = Action.objects.select_for_update().filter(proposed_by_agent=agent, status__in=UNRESOLVED_STATUSES)
        for action in unresolved.order_by("pk"):
            event_record(
                action=action,
                transition="agent_owner_changed",
                from_state=action.status,
                actor=actor,
                reason=reason or "The proposing agent's owner changed.",
                evidence=evidence,
                now=now,
            )
        security_event_record(
            kind=SecurityEventKind.AGENT_OWNER_CHANGED,
            user=user,
            subject=f"agent {agent.name}",
            detail={**evidence, "tokens_revoked": revoked, "reason": reason},
        )
    return agent


def agent_authenticate(*, plain: str, now: datetime | None = None) -> AgentToken:
    """Find the active token and agent for a presented token, or raise AgentAuthenticationFailed."""
    now = now or timezone.now()
    if not plain.startswith(TOKEN_MARKER) or len(plain) > 200:
        raise AgentAuthenticationFailed("token_invalid", _INVALID_MESSAGE)
    token = AgentToken.objects.select_related("agent", "agent__owner").filter(token_hash=token_hash(plain)).first()
    if token is None or token.revoked_at is not None:
        raise AgentAuthenticationFailed("token_invalid", _INVALID_MESSAGE)
    if not token.agent.is_active:
        raise AgentAuthenticationFailed(
            "agent_inactive",
            f"The agent {token.agent.name!r} is deactivated. Ask its owner to reactivate it in the console.",
            agent=token.agent,
        )
    # A conditional UPDATE, so that concurrent requests of one token write at most once per
    # resolution period and never wait for each other.
    AgentToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ).update(last_used_at=now)
    return token


_INVALID_MESSAGE = "The token is not valid: it is unknown, revoked, or was replaced by a rotation."
