"""The memo kind's contract with the engine: everything the engine asks of it, and nothing more."""

from __future__ import annotations

from actions.kinds.base import EffectKind, Explanations
from actions.models import Action
from actions.providers.money import to_minor_units
from tests.kinds.memo.adapter import Board

MEMO = "memo"


def memo_action_id(*, topic: str, number: int) -> str:
    """The action id names the business action: this topic's note number ``number``."""
    return f"{MEMO}:{topic}:{number}"


class MemoKind(EffectKind):
    name = MEMO
    label = "Memo"
    explanations = Explanations(
        noun="note",
        succeeded="The board pinned the note.",
        pending="The board is pinning the note.",
        failed="The board refused the note",
        on_failure="Nothing to follow up.",
    )
    id_pattern = "memo:<topic>:<n>"
    example_action_id = "memo:launch:1"

    def __init__(self) -> None:
        self.board = Board()

    def receiver(self) -> Board:
        return self.board

    def expected_amount_minor(self, action: Action) -> int | None:
        return to_minor_units(action.amount, action.currency)

    def target_label(self, action: Action) -> str:
        return f"topic {action.payload.get('topic', '-')}"
