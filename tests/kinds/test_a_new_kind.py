"""A new kind goes through the whole engine by the registry alone (issue: effect kinds).

propose -> approve -> dispatch -> crash after the receiver answered -> lease sweep -> reconcile
-> SUCCEEDED, with one effect at the receiver. The kind is ``tests/kinds/memo/``: one package
shaped like a shipped kind's, added by one registry line; no app module was touched for it,
and no app module names it (the last tests here grep for it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import check_effects
from actions.engine.reconcile import reconcile_action
from actions.engine.send import receiver_send
from actions.engine.sweeps import sweep_expired_leases
from actions.foundation.trail import Actor
from actions.kinds import kind_for, register, unregister
from actions.kinds.fields import ProposalInvalid
from actions.models import Action, ActionEvent, ActionStatus, Attempt
from approvals.models import Decision
from approvals.services import approval_decide
from tests.kinds.memo.contract import MEMO, MemoKind
from tests.kinds.memo.proposal import memo_propose
from tests.test_architecture import measure

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


@pytest.fixture
def memo_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoKind]:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    kind = register(MemoKind())  # the one registry line a new kind needs
    assert isinstance(kind, MemoKind)
    yield kind
    unregister(MEMO)


def propose_memo(proposer: Actor, *, number: int = 1) -> Action:
    return memo_propose(topic="launch", number=number, text="Ship it on Monday.", proposer=proposer).action


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


def test_the_new_kinds_own_checks_refuse_bad_input_through_the_shared_recording(agent_actor: Actor) -> None:
    """Invariant 11 for a kind the services have never heard of: its package's checks name every
    bad field at once, and nothing is written."""
    with pytest.raises(ProposalInvalid) as refused:
        memo_propose(topic="no spaces", number="first", text="", proposer=agent_actor)
    assert [problem.field for problem in refused.value.problems] == ["topic", "request_number", "text"]
    assert not Action.objects.exists()


# --- the app does not know the test kind -----------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_DIRECTORIES = ("actions", "approvals", "console", "templates")
APP_SUFFIXES = (".py", ".html", ".txt", ".js", ".json", ".css")
TEST_KIND_NAMES = re.compile(rf"\b{MEMO}\b|{MemoKind.__name__}|tests[./]kinds[./]{MEMO}", re.IGNORECASE)


def app_files_naming(pattern: re.Pattern[str]) -> list[str]:
    """Every app file (without migrations) with a line that matches ``pattern``, as path:line."""
    found: list[str] = []
    for directory in APP_DIRECTORIES:
        for path in sorted((REPO_ROOT / directory).rglob("*")):
            if not path.is_file() or path.suffix not in APP_SUFFIXES or "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{number}")
    return found


def test_no_app_file_names_the_test_kind() -> None:
    """The kind lives in its own package and one registry line; the app code (actions/,
    approvals/, console/ and the templates, migrations aside) never names it, so everything the
    end-to-end test above saw came from the registry."""
    assert app_files_naming(TEST_KIND_NAMES) == []


def test_no_app_module_branches_on_a_kinds_name_outside_actions_kinds() -> None:
    """No ``kind == "refund"`` nor ``kind in ("refund", ...)`` outside ``actions/kinds/``: the
    engine and the services ask the kind (the detector is tests/test_architecture.py's)."""
    assert measure().kind_branches == []
