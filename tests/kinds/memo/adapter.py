"""The memo's receiver: an in-memory board that pins a note once per key and says which it has."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta

from actions.kinds.base import Answer, Effect, LedgerWindow, Lookup, LookupVerdict, Outcome, ReceiverContract, StepClass
from actions.models import Action
from actions.providers.money import to_minor_units


class Board:
    """The receiver: pins a note once per key, and says which notes it has."""

    contract = ReceiverContract(
        receiver="memo board",
        honours_keys=True,
        key_retention=None,
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=timedelta(0),
        can_settle_later=False,
        step_class=StepClass.CREATE,
        correction_path="Unpin the extra note.",
    )

    def __init__(self) -> None:
        self.notes: dict[str, Effect] = {}
        self.sends = 0
        self._ids = itertools.count(1)

    def send(self, action: Action) -> Answer:
        self.sends += 1
        note = self.notes.get(action.idempotency_key)
        if note is None:
            note = Effect(
                reference=f"note_{next(self._ids)}",
                status="pinned",
                outcome=Outcome.SUCCEEDED,
                amount_minor=to_minor_units(action.amount, action.currency),
                currency=action.currency,
                action_id=action.action_id,
                raw={"key": action.idempotency_key, "text": action.payload.get("text", "")},
            )
            self.notes[action.idempotency_key] = note
        return note.answer()

    def lookup(self, action: Action) -> Lookup:
        found = [note for note in self.notes.values() if note.action_id == action.action_id]
        if not found:
            return Lookup(LookupVerdict.NOT_FOUND)
        return Lookup(LookupVerdict.FOUND if len(found) == 1 else LookupVerdict.DUPLICATE, found)

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        # A board keeps no times: every window lists every note.
        return iter(list(self.notes.values()))
