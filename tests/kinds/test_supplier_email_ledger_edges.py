"""The ledger audit of a receiver that cannot be asked about one action (the mail relay): an
action judged in one window whose message the relay listed in the window before is no finding,
and a repeat whose copies straddle the edge is still found."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from actions.engine.ledger import ledger_compare, ledger_reader_before
from actions.kinds import kind_for
from actions.kinds.base import Effect, LedgerWindow, Outcome
from actions.models import Action, ActionStatus, DiscrepancyKind
from tests.kinds.test_supplier_email import approved_email, no_publish  # noqa: F401 -- the fixture

EDGE = timezone.now().replace(microsecond=0) - timedelta(hours=2)
BEFORE = LedgerWindow(start=EDGE - timedelta(hours=1), end=EDGE)
AFTER = LedgerWindow(start=EDGE, end=EDGE + timedelta(hours=1))


class RelayLedger:
    """The relay's list of messages, by the time it accepted each one; it has no lookup."""

    def __init__(self, messages: list[Effect]) -> None:
        self.messages = messages
        self.reads: list[LedgerWindow] = []

    def ledger(self, window: LedgerWindow | None = None) -> list[Effect]:
        assert window is not None
        self.reads.append(window)
        return [m for m in self.messages if m.created is not None and window.holds(m.created)]


def message(action: Action, reference: str, at: Any) -> Effect:
    return Effect(
        reference=reference,
        status="accepted",
        outcome=Outcome.SUCCEEDED,
        amount_minor=None,
        currency="",
        action_id=action.action_id,
        created=at,
    )


def sent_across_the_edge(agent_actor: Any, manager: Any) -> Action:  # with the ``supplier`` fixture
    """Sent a second before the edge, recorded SUCCEEDED a second after it."""
    action = approved_email(agent_actor, manager)
    Action.objects.filter(pk=action.pk).update(
        status=ActionStatus.SUCCEEDED,
        provider_reference="<m1@console>",
        first_attempt_at=EDGE - timedelta(seconds=2),
        status_changed_at=EDGE + timedelta(seconds=1),
    )
    return Action.objects.get(pk=action.pk)


def judged_after_the_edge(relay: RelayLedger, *, asked: bool) -> list[tuple[str, str]]:
    effects = relay.ledger(AFTER)
    ask = ledger_reader_before(relay, AFTER, effects, margin=timedelta(minutes=10)) if asked else None  # type: ignore[arg-type]
    result = ledger_compare(
        kind=kind_for("supplier_email"), effects=effects, window=AFTER, judged_before=timezone.now(), ask=ask
    )
    return [(finding.kind, finding.provider_reference) for finding in result.findings]


def test_a_message_listed_just_before_the_window_of_its_success_is_no_finding(
    agent_actor: Any, manager: Any, supplier: Any
) -> None:
    action = sent_across_the_edge(agent_actor, manager)
    relay = RelayLedger([message(action, "<m1@console>", EDGE - timedelta(seconds=1))])

    # Judged on this window alone, the success has no message: the false finding of old.
    assert judged_after_the_edge(relay, asked=False) == [(DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT, "<m1@console>")]
    # Asked through the relay's ledger before the window, from the first attempt less the margin.
    assert judged_after_the_edge(relay, asked=True) == []
    assert relay.reads[-1] == LedgerWindow(start=EDGE - timedelta(seconds=2) - timedelta(minutes=10), end=EDGE)


def test_a_second_message_on_the_other_side_of_the_edge_is_still_a_duplicate(
    agent_actor: Any, manager: Any, supplier: Any
) -> None:
    action = sent_across_the_edge(agent_actor, manager)
    relay = RelayLedger(
        [
            message(action, "<m1@console>", EDGE - timedelta(seconds=1)),
            message(action, "<m2@console>", EDGE + timedelta(seconds=30)),
        ]
    )

    assert judged_after_the_edge(relay, asked=True) == [(DiscrepancyKind.DUPLICATE_EFFECT, "<m1@console>")]
