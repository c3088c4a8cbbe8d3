"""The accounting system's credit notes, listed one span of creation times at a time: the
ledger audit's windows on the invoice adjustment kind's receiver."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from actions.kinds.invoice_adjustment.contract import accounting_from_settings
from tests.providers.accounting_client import AccountingSandboxClient


def test_the_credit_notes_are_listed_one_span_of_creation_times_at_a_time(
    live_accounting: AccountingSandboxClient,
) -> None:
    created: dict[str, datetime] = {}
    for hour in range(3):
        for _ in range(2):
            note = live_accounting.plant_credit_note(Reference=f"invoice-adjustment:h{hour}", Total="5.00")
            created[note["CreditNoteID"]] = datetime.fromtimestamp(
                int(note["CreatedDateUTC"][6:-7]) / 1000, tz=UTC
            )
        live_accounting.advance_clock(3600)
    second_hour = sorted(created.values())[2].replace(microsecond=0)
    client = accounting_from_settings()

    window = list(client.iter_ledger(created_from=second_hour, created_before=second_hour + timedelta(hours=1)))

    assert {note.reference for note in window} == {"invoice-adjustment:h1"}
    assert len(window) == 2
    assert all(note.created is not None and second_hour <= note.created for note in window)
    assert len(list(client.iter_ledger(created_before=second_hour))) == 2
    assert len(list(client.iter_ledger())) == 6

