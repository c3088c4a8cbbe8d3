"""The lease-plus-attempt block: every send starts with one committed record of intent.

A claim, a reconciliation's retry and finance's "retry with the same key" all take a fresh
lease through a transition and write the attempt that names it, in the caller's transaction.
Only the holder of that token may record the answer (invariant 3).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from actions.foundation.trail import Actor, Writes, action_transition, attempt_write
from actions.kinds import kind_for
from actions.models import Action, Attempt, AttemptKind


@dataclass(frozen=True)
class Lease:
    action: Action
    attempt: Attempt
    token: uuid.UUID


def lease_take(
    *,
    action: Action,
    transition: str,
    actor: Actor,
    reason: str,
    evidence: dict[str, Any],
    now: datetime,
    writes: Writes | None = None,
) -> Lease:
    """Run ``transition`` (one that takes a lease) and record the attempt about to be sent.

    ``writes``: the claim's, which writes the action's row, the event and the attempt at its end
    (actions.foundation.trail.Writes); the attempt has its key once they are written."""
    token = uuid.uuid4()
    expires_at = now + timedelta(seconds=settings.LEASE_SECONDS)
    action_transition(
        action=action,
        transition=transition,
        actor=actor,
        reason=reason,
        evidence={**evidence, "lease_expires_at": expires_at.isoformat()},
        now=now,
        writes=writes,
        lease_token=token,
        lease_expires_at=expires_at,
        started_at=now,
    )
    attempt = attempt_start(action, AttemptKind.SUBMIT, token=token, now=now, writes=writes)
    return Lease(action=action, attempt=attempt, token=token)


def attempt_start(
    action: Action, kind: AttemptKind, *, token: uuid.UUID, now: datetime, writes: Writes | None = None
) -> Attempt:
    """Insert the attempt about to be made under the lease ``token`` (or with ``writes``): a
    submission carries the request sent, a lookup the question asked, both under the action's key."""
    kind_of_action = kind_for(action.kind)
    request = (
        kind_of_action.request_body(action) if kind == AttemptKind.SUBMIT else kind_of_action.lookup_request(action)
    )
    attempt = Attempt(
        action=action,
        kind=kind,
        lease_token=token,
        idempotency_key=action.idempotency_key,
        request=request,
        started_at=now,
    )
    return attempt_write(attempt, writes=writes)
