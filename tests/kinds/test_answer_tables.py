"""The invoice adjustment's and the supplier email's answer tables, row by row, without a
database or a receiver's process.

Each kind's module has the table in a comment (what the receiver said, the outcome it proves);
these tests pin every row of it and every field of the effect a receiver's record becomes, as
``tests/actions/test_outcome_table.py`` does for the refund. The scenario tests that reach the
tables need the accounting and mail sandboxes, which the mutation runs' fast subset leaves out
(tests/MUTATION.md, thirteenth batch).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
import requests

from actions.kinds.base import Answer, Effect, LedgerUnavailable, Outcome, ReceiverContract, StepClass
from actions.kinds.invoice_adjustment.contract import (
    answer_from_create_error,
    credit_notes_by_bill,
    effect_from_credit_note,
    outcome_of_credit_note_status,
)
from actions.kinds.invoice_adjustment.void import VoidReceiver
from actions.kinds.supplier_email import contract as supplier_email
from actions.kinds.supplier_email.contract import (
    MailRelay,
    answer_from_mail_error,
    effect_from_accepted,
    effect_from_ledger_row,
    message_reference,
    reference_of_message_id,
)
from actions.models import Action
from actions.providers.accounting.client import CreditNote, CreditNoteStatus
from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    DefinitiveError,
    IdempotencyMismatchError,
    NotFoundError,
    ProviderError,
)
from actions.providers.mail.smtp import Accepted, MailAmbiguous, MailError, MailNotSent, MailRejected

# --- the invoice adjustment: the accounting system's credit notes ---------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (CreditNoteStatus.AUTHORISED, Outcome.SUCCEEDED),
        (CreditNoteStatus.PAID, Outcome.SUCCEEDED),
        (CreditNoteStatus.VOIDED, Outcome.FAILED_FINAL),
        (CreditNoteStatus.DELETED, Outcome.FAILED_FINAL),
        (CreditNoteStatus.DRAFT, Outcome.NEEDS_REVIEW),
        (CreditNoteStatus.SUBMITTED, Outcome.NEEDS_REVIEW),
        ("A WORD THE TABLE DOES NOT KNOW", Outcome.NEEDS_REVIEW),
    ],
)
def test_a_credit_notes_status_maps_to_the_outcome_it_proves(status: str, outcome: Outcome) -> None:
    """Only an authorised or paid credit note adjusts the bill; a voided or deleted one never
    will; a draft, a submitted one or an unknown word waits for a person, not for the receiver."""
    assert outcome_of_credit_note_status(status) == outcome


def credit_note(**changes: object) -> CreditNote:
    fields: dict[str, object] = {
        "id": "cn-1",
        "number": "CN-0001",
        "reference": "invoice_adjustment:BILL-7:1",
        "status": CreditNoteStatus.AUTHORISED,
        "total": Decimal("12.50"),
        "currency": "EUR",
        "invoice_id": "inv-7",
        "raw": {"CreditNoteID": "cn-1", "Status": "AUTHORISED"},
    }
    fields.update(changes)
    return CreditNote(**fields)  # type: ignore[arg-type]


def test_a_credit_note_becomes_the_effect_reconciliation_and_the_audit_read() -> None:
    note = credit_note()

    effect = effect_from_credit_note(note)

    assert effect == Effect(
        reference="cn-1",
        status=CreditNoteStatus.AUTHORISED,
        outcome=Outcome.SUCCEEDED,
        amount_minor=1250,
        currency="EUR",
        action_id="invoice_adjustment:BILL-7:1",
    )
    assert effect.raw == {"CreditNoteID": "cn-1", "Status": "AUTHORISED"}
    assert effect.raw is not note.raw, "a copy: the evidence is not changed through the client's object"


def test_a_voided_credit_note_is_a_failed_effect() -> None:
    assert effect_from_credit_note(credit_note(status=CreditNoteStatus.VOIDED)).outcome == Outcome.FAILED_FINAL


def test_a_credit_note_without_a_currency_or_a_reference_names_no_amount_and_no_action() -> None:
    """A record the accounting system returned half filled: no amount is guessed, and an empty
    reference belongs to no action (the audit counts it as nobody's)."""
    effect = effect_from_credit_note(credit_note(currency="", reference=""))

    assert (effect.amount_minor, effect.currency, effect.action_id) == (None, "", None)


@pytest.mark.parametrize(
    ("error", "resend", "outcome"),
    [
        (IdempotencyMismatchError("key reused", code="idempotency_error"), False, Outcome.NEEDS_REVIEW),
        (IdempotencyMismatchError("key reused", code="idempotency_error"), True, Outcome.NEEDS_REVIEW),
        (AmbiguousError("read timed out", code="timeout"), False, Outcome.UNKNOWN),
        (AmbiguousError("read timed out", code="timeout"), True, Outcome.UNKNOWN),
        (DefinitiveError("over the amount due", code="validation"), False, Outcome.FAILED_FINAL),
        (NotFoundError("no such bill", code="not_found"), False, Outcome.FAILED_FINAL),
        # On a resend the amount due may be gone because the first attempt took it.
        (DefinitiveError("over the amount due", code="validation"), True, Outcome.UNKNOWN),
        (NotFoundError("no such bill", code="not_found"), True, Outcome.UNKNOWN),
        (ConfigurationError("credentials refused", code="unauthorized"), False, Outcome.UNKNOWN),
        (ProviderError("an error this table does not know"), False, Outcome.UNKNOWN),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_an_error_from_creating_a_credit_note_maps_to_the_outcome_it_proves(
    error: ProviderError, resend: bool, outcome: Outcome
) -> None:
    answer = answer_from_create_error(error, resend=resend)

    assert answer == Answer(outcome=outcome, error=error)


# --- the supplier email: the mail relay ----------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (MailNotSent("451 try again later", smtp_code=451, content_sent=False), Outcome.NOT_SENT),
        (MailRejected("550 no such mailbox", smtp_code=550, content_sent=False), Outcome.FAILED_FINAL),
        (MailRejected("554 rejected after the content", smtp_code=554, content_sent=True), Outcome.FAILED_FINAL),
        (MailAmbiguous("connection lost after the content", content_sent=True), Outcome.UNKNOWN),
        (MailError("a backend that cannot say when it failed"), Outcome.UNKNOWN),
    ],
    ids=["4xx-before-the-content", "5xx", "5xx-after-the-content", "lost-after-the-content", "unknown-error"],
)
def test_a_relays_error_maps_to_the_outcome_it_proves(error: MailError, outcome: Outcome) -> None:
    assert answer_from_mail_error(error) == Answer(outcome=outcome, error=error)


ACTION_ID = "supplier_email:acme:PO-7:late_delivery"
# The console's message for ACTION_ID, as the relay's answer and its ledger both describe it.
THE_MESSAGE_SENT = Effect(
    reference=message_reference(ACTION_ID),
    status="accepted",
    outcome=Outcome.SUCCEEDED,
    amount_minor=None,
    currency="",
    action_id=ACTION_ID,
)


def test_a_message_the_relay_accepted_is_a_succeeded_effect_named_by_the_message() -> None:
    accepted = Accepted(message_id="<email-abc@console.example>", reply="250 2.0.0 Ok: queued as 7F3")

    effect = effect_from_accepted(Action(action_id=ACTION_ID), accepted)

    assert effect == THE_MESSAGE_SENT
    assert effect.raw == {"message_id": "<email-abc@console.example>", "reply": "250 2.0.0 Ok: queued as 7F3"}


def test_a_row_of_the_relays_ledger_is_the_effect_of_the_message_it_names() -> None:
    row = {
        "id": 41,
        "message_id": f" <{message_reference(ACTION_ID)}@console.example> ",
        "action_id": ACTION_ID,
        "rcpt_to": "orders@acme.example",
        "subject": "Late delivery of PO-7",
        "possible_repeat": True,
        "body": "not kept: the ledger's evidence is the envelope, not the text",
    }

    effect = effect_from_ledger_row(row)

    assert effect == THE_MESSAGE_SENT
    assert effect.raw == {
        "id": 41,
        "message_id": row["message_id"],
        "action_id": ACTION_ID,
        "rcpt_to": "orders@acme.example",
        "subject": "Late delivery of PO-7",
        "possible_repeat": True,
    }


def test_a_ledger_row_that_names_no_message_and_no_action_is_nobodys() -> None:
    """A message the console did not send (someone used the relay by hand): no reference, no
    action, and every field the evidence keeps is there, empty."""
    effect = effect_from_ledger_row({"id": 42, "action_id": ""})

    assert (effect.reference, effect.action_id) == ("", None)
    assert effect.raw == {
        "id": 42,
        "message_id": None,
        "action_id": "",
        "rcpt_to": None,
        "subject": None,
        "possible_repeat": None,
    }


@pytest.mark.parametrize(
    ("message_id", "reference"),
    [
        ("<email-abc@console.example>", "email-abc"),
        ("  <email-abc@console.example>\r\n", "email-abc"),
        ("email-abc@console.example", "email-abc"),
        ("<email-abc>", "email-abc"),
        # A message someone sent through the relay by hand: only the angle brackets go.
        ("<XMAS-offer-X@shop.example>", "XMAS-offer-X"),
    ],
)
def test_a_message_id_names_its_message_by_the_part_before_the_domain(message_id: str, reference: str) -> None:
    assert reference_of_message_id(message_id) == reference


class _FailingMailer:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def send(self, message: object) -> Accepted:
        raise self.error


def test_an_error_the_mail_backend_does_not_classify_is_ambiguous_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend error that is not a MailError cannot say when it failed: the message may have
    left (the table's last row), and the answer names what was raised."""
    monkeypatch.setattr(supplier_email, "outgoing_email", lambda action: None)
    relay = MailRelay(_FailingMailer(OSError("connection reset")), ledger_url="")  # type: ignore[arg-type]

    answer = relay.send(Action(action_id=ACTION_ID))

    assert answer.outcome == Outcome.UNKNOWN
    assert isinstance(answer.error, MailAmbiguous)
    assert (answer.error.message, answer.error.content_sent) == ("OSError: connection reset", None)


def test_voiding_a_credit_note_is_a_set_step_that_reconciliation_can_decide_by_looking() -> None:
    """The void's contract, from which the engine draws its consequences: no key is kept (none
    is needed), a lookup by the credit note's id is authoritative and immediate, nothing settles
    later, and voiding twice changes nothing (a SET step)."""
    client = object()

    receiver = VoidReceiver(client)  # type: ignore[arg-type]

    assert receiver.client is client
    assert receiver.contract == ReceiverContract(
        receiver="accounting system",
        honours_keys=False,
        key_retention=None,
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=timedelta(0),
        can_settle_later=False,
        step_class=StepClass.SET,
        correction_path="A person re-issues the credit note if a void was wrong.",
    )


def ledger_effect(reference: str, raw: dict[str, object]) -> Effect:
    return Effect(
        reference=reference,
        status=CreditNoteStatus.AUTHORISED,
        outcome=Outcome.SUCCEEDED,
        amount_minor=100,
        currency="EUR",
        action_id=None,
        raw=raw,
    )


def test_the_accounting_ledger_is_listed_per_bill_by_its_allocation_or_its_own_invoice_id() -> None:
    """The bill a credit note belongs to is the invoice of its first allocation; without one, the
    record's own InvoiceID; without either, it is listed under "" (nobody's bill), not dropped."""
    allocated = ledger_effect(
        "cn-1", {"Allocations": [{"Invoice": {"InvoiceID": "inv-7"}}, {"Invoice": {"InvoiceID": "inv-9"}}]}
    )
    also_allocated = ledger_effect("cn-2", {"Allocations": [{"Invoice": {"InvoiceID": "inv-7"}}], "InvoiceID": "inv-1"})
    unallocated = ledger_effect("cn-3", {"Allocations": [], "InvoiceID": "inv-8"})
    allocation_without_invoice = ledger_effect("cn-4", {"Allocations": [{"Amount": "1.00"}]})
    nobodys = ledger_effect("cn-5", {})

    listing = credit_notes_by_bill([allocated, also_allocated, unallocated, allocation_without_invoice, nobodys])

    assert listing == {
        "inv-7": [allocated, also_allocated],
        "inv-8": [unallocated],
        "": [allocation_without_invoice, nobodys],
    }
    assert type(listing) is dict, "a plain dict: a missing bill reads as absent, not as a new empty list"


class _Response:
    def __init__(self, payload: object, *, failure: Exception | None = None) -> None:
        self.payload, self.failure = payload, failure

    def raise_for_status(self) -> None:
        if self.failure is not None:
            raise self.failure

    def json(self) -> object:
        return self.payload


def test_the_mail_sandboxs_ledger_is_read_from_its_messages_list_with_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, object]] = []
    row = {"id": 1, "message_id": "<email-abc@console.example>", "action_id": ACTION_ID}

    def get(url: str, **options: object) -> _Response:
        calls.append((url, options.get("timeout")))
        return _Response({"messages": [row]})

    monkeypatch.setattr(supplier_email.requests, "get", get)

    effects = list(MailRelay(object(), ledger_url="http://127.0.0.1:8025/").ledger())  # type: ignore[arg-type]

    assert calls == [("http://127.0.0.1:8025/messages", 10)]
    assert [effect.reference for effect in effects] == ["email-abc"]


def test_a_mail_sandbox_whose_list_cannot_be_read_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = requests.HTTPError("503 Server Error")
    monkeypatch.setattr(supplier_email.requests, "get", lambda url, **options: _Response({}, failure=failure))

    with pytest.raises(LedgerUnavailable) as raised:
        list(MailRelay(object(), ledger_url="http://127.0.0.1:8025").ledger())  # type: ignore[arg-type]

    assert str(raised.value) == "the mail sandbox's list could not be read: 503 Server Error"
    assert raised.value.__cause__ is failure
