"""A payload carries its kind's schema version, and the version is part of its hash: an identical
retry keeps its 200 replay across a release that changes a kind's composition, a different one
is still a 409 (docs/api-versions.md, "Payload schema versions")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any, ClassVar

import pytest
from django.db import transaction
from django.utils import timezone

from actions.kinds import register, unregister
from actions.models import Action
from actions.services import (
    Actor,
    ProposalConflict,
    ProposalResult,
    existing_or_conflict,
    payload_hash,
    payload_versioned,
    proposal_record,
)
from tests.api.conftest import ApiClient, assert_problem
from tests.kinds.memo.contract import MEMO, MemoKind

pytestmark = pytest.mark.django_db(transaction=True)


class MemoV1(MemoKind):
    """The memo kind as one release composes it."""

    payload_schema_version: ClassVar[int] = 1

    @staticmethod
    def compose(topic: str, number: int, text: str, amount: str) -> dict[str, Any]:
        return {"kind": MEMO, "topic": topic, "n": number, "text": text, "amount": amount, "currency": "EUR"}


class MemoV2(MemoV1):
    """The next release: the payload also names the board, so the composition's version rises."""

    payload_schema_version: ClassVar[int] = 2

    @staticmethod
    def compose(topic: str, number: int, text: str, amount: str) -> dict[str, Any]:
        return {**MemoV1.compose(topic, number, text, amount), "board": "main"}


def propose_memo(
    kind: type[MemoV1], proposer: Actor, *, text: str = "Ship it.", amount: str = "1.00"
) -> ProposalResult:
    """The proposal services' skeleton for the memo kind: compose, stamp, hash, then replay,
    conflict or record."""
    payload = payload_versioned(kind.compose("launch", 1, text, amount))
    digest = payload_hash(payload)
    with transaction.atomic():
        existing = Action.objects.filter(action_id="memo:launch:1").first()
        if existing is not None:
            return existing_or_conflict(existing, payload, digest)
        return proposal_record(
            action=Action(
                action_id="memo:launch:1",
                kind=MEMO,
                idempotency_key="memo:launch:1",
                payload=payload,
                payload_hash=digest,
                amount=Decimal(amount),
                currency="EUR",
                reason_code="goodwill",
                proposed_by_agent=proposer.agent,
                proposed_by_user=proposer.accountable_user,
            ),
            proposer=proposer,
            now=timezone.now(),
            policy_reasons=[],
            event_evidence={"payload": payload},
            auto_policy=False,
        )


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[type[MemoV1]], object]]:
    """Registers the memo kind as a release ships it; calling it again is the next release."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    yield lambda kind: register(kind())
    unregister(MEMO)


def test_the_payload_carries_its_kinds_schema_version_and_the_hash_covers_it(
    release: Callable[[type[MemoV1]], object], agent_actor: Actor
) -> None:
    release(MemoV1)
    action = propose_memo(MemoV1, agent_actor).action
    assert action.payload["schema_version"] == 1
    assert action.payload_hash == payload_hash(action.payload)
    unversioned = {k: v for k, v in action.payload.items() if k != "schema_version"}
    assert payload_hash(unversioned) != action.payload_hash


def test_an_identical_retry_across_a_release_that_changed_the_composition_replays(
    release: Callable[[type[MemoV1]], object], agent_actor: Actor
) -> None:
    release(MemoV1)
    first = propose_memo(MemoV1, agent_actor)
    assert first.created

    release(MemoV2)
    retry = propose_memo(MemoV2, agent_actor)

    assert not retry.created and retry.action.pk == first.action.pk
    assert retry.action.payload["schema_version"] == 1, "the action keeps the payload it was proposed with"


def test_a_new_proposal_after_the_release_is_composed_by_the_new_version(
    release: Callable[[type[MemoV1]], object], agent_actor: Actor
) -> None:
    release(MemoV2)
    action = propose_memo(MemoV2, agent_actor).action
    assert action.payload["schema_version"] == 2 and action.payload["board"] == "main"


def test_a_different_retry_across_the_release_is_still_a_conflict_naming_the_field(
    release: Callable[[type[MemoV1]], object], agent_actor: Actor
) -> None:
    release(MemoV1)
    propose_memo(MemoV1, agent_actor)

    release(MemoV2)
    with pytest.raises(ProposalConflict) as conflict:
        propose_memo(MemoV2, agent_actor, amount="2.00")
    assert conflict.value.differing == {"amount": {"existing": "1.00", "proposed": "2.00"}}


def test_within_one_version_any_difference_is_a_conflict(
    release: Callable[[type[MemoV1]], object], agent_actor: Actor
) -> None:
    release(MemoV2)
    propose_memo(MemoV2, agent_actor)
    with pytest.raises(ProposalConflict) as conflict:
        propose_memo(MemoV2, agent_actor, text="Ship it on Tuesday.")
    assert set(conflict.value.differing) == {"text"}


# --- the refund API across the release that introduced the versions -------------------------


def test_a_refund_proposed_before_payloads_had_versions_replays_an_identical_retry(
    api: ApiClient, proposal: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's retry that crossed this release: its refund was stored without a version
    (as every payload before it), and the same request now composes version 1."""
    with monkeypatch.context() as before_versions:
        before_versions.setattr("actions.services.payload_versioned", lambda payload: payload)
        first = api.post("/api/v1/refunds", proposal)
    assert first.status_code == 201, first.content
    stored = Action.objects.get()
    assert "schema_version" not in stored.payload

    retry = api.post("/api/v1/refunds", proposal)
    assert retry.status_code == 200, retry.content
    assert retry.json()["action_id"] == stored.action_id

    changed = api.post("/api/v1/refunds", {**proposal, "amount": "41.00"})
    body = assert_problem(changed, 409, "payload_conflict")
    assert "amount" in str(body)
