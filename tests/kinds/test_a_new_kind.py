"""A new kind goes through the whole engine by the registry alone (issue: effect kinds).

propose -> approve -> dispatch -> crash after the receiver answered -> lease sweep -> reconcile
-> SUCCEEDED, with one effect at the receiver. The kind is ``tests.kinds.memory``: one module,
registered by name; no engine module was touched for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import check_effects
from actions.engine.reconcile import reconcile_action
from actions.engine.send import receiver_send
from actions.engine.sweeps import sweep_expired_leases
from actions.kinds import kind_for, register, unregister
from actions.models import Action, ActionEvent, ActionStatus, Attempt
from actions.services import Actor, payload_hash, proposal_record
from approvals.models import Decision
from approvals.services import approval_decide
from tests.kinds.memory import MEMO, MemoKind, memo_payload

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


@pytest.fixture
def memo_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoKind]:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    kind = MemoKind()
    register(kind)
    yield kind
    unregister(MEMO)


def propose_memo(proposer: Actor, *, number: int = 1) -> Action:
    payload = memo_payload(topic="launch", number=number, text="Ship it on Monday.")
    action_id = f"memo:launch:{number}"
    with transaction.atomic(durable=True):
        return proposal_record(
            action=Action(
                action_id=action_id,
                kind=MEMO,
                idempotency_key=action_id,
                payload=payload,
                payload_hash=payload_hash(payload),
                amount=Decimal(payload["amount"]),
                currency=payload["currency"],
                reason_code="goodwill",
                proposed_by_agent=proposer.agent,
                proposed_by_user=proposer.accountable_user,
            ),
            proposer=proposer,
            now=timezone.now(),
            policy_reasons=[],
            event_evidence={"payload": payload},
            auto_policy=False,
        ).action


def test_a_kind_registered_in_one_module_goes_through_the_engine_crash_included(
    memo_kind: MemoKind, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """Invariants 1, 2, 3 and 9 for a kind the engine has never heard of: the worker is lost
    after the receiver pinned the note and before anything was recorded; the lease sweep and
    reconciliation find the note, and nothing is sent twice."""
    assert kind_for(MEMO) is memo_kind
    action = propose_memo(agent_actor)
    assert action.status == S.PROPOSED

    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED and claim.action is not None

    # The receiver answers, then the worker dies before recording (no submission_record).
    answer = receiver_send(action=claim.action)
    assert answer.effect is not None and memo_kind.board.sends == 1
    assert Action.objects.get(pk=action.pk).status == S.SUBMITTING

    later = timezone.now() + timedelta(minutes=5)
    assert sweep_expired_leases(now=later) == 1
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN

    result = reconcile_action(action_pk=action.pk, now=later + timedelta(minutes=5))

    done = Action.objects.get(pk=action.pk)
    assert result == S.SUCCEEDED and done.status == S.SUCCEEDED
    assert done.provider_reference == answer.effect.reference
    assert memo_kind.board.sends == 1, "found by the lookup, never re-sent"
    assert len(memo_kind.board.notes) == 1
    assert execution_dispatch(action_pk=action.pk) == ClaimOutcome.TAKEN.value
    assert memo_kind.board.sends == 1
    assert list(ActionEvent.objects.filter(action=done).values_list("transition", flat=True)) == [
        "propose",
        "approve",
        "begin_submission",
        "mark_unknown",
        "reconcile_found",
    ]
    lookups = Attempt.objects.filter(action=done, kind="lookup")
    assert [attempt.outcome for attempt in lookups] == ["found"]
    report = check_effects(ledger=list(memo_kind.board.ledger()))
    assert [v for v in report.violations if v.subject == done.action_id] == []


def test_a_new_kind_answers_the_five_checks_from_its_contract(memo_kind: MemoKind, finance: Any, client: Any) -> None:
    """The /kinds/ page shows a card for a kind it was never told about."""
    client.force_login(finance)
    page = client.get("/kinds/").content.decode()
    assert 'id="kind-memo"' in page
    assert "memo board" in page
    assert "memo:launch:1" in page
