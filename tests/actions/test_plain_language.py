"""Words for clerks: every provider error and internal term shown to a clerk has a
sentence, the raw detail stays behind "Technical details", no status codes, money with currency."""

from __future__ import annotations

import pytest

from actions import plain
from actions.kinds.base import error_json
from actions.providers.base import AmbiguousError, NotFoundError
from actions.review.selectors.common import effect_fields

TRANSITIONS_IN_THE_CODE = [
    "agent_owner_changed", "approve", "assign_owner", "begin_submission", "cancel", "escalate", "invalidate",
    "mark_unknown", "propose", "reconcile_found", "record_failure", "record_not_sent", "record_pending",
    "record_success", "reject", "reopen", "resolve_failed", "resolve_retry", "resolve_succeeded", "retry", "settle",
]  # fmt: skip


@pytest.mark.parametrize("transition", TRANSITIONS_IN_THE_CODE)
def test_every_transition_has_words_without_its_code_name(transition: str) -> None:
    words = plain.transition_words(transition)
    assert transition not in words and "_" not in words
    assert transition in plain.TRANSITIONS


def test_begin_submission_says_what_happened() -> None:
    assert plain.transition_words("begin_submission") == "Sent to the payment provider"
    assert plain.transition_words("begin_submission", receiver="mail relay") == "Sent to the mail relay"


@pytest.mark.parametrize(
    ("label", "words"),
    [
        ("system:dispatcher", "the console (sending)"),
        ("system:reconciler", "the console (checking with the provider)"),
        ("system:auto-approval", "the auto-approval policy"),
        ("system:something-new", "the console"),
        ("agent:support-bot", "agent support-bot"),
        ("maria.manager", "maria.manager"),
    ],
)
def test_actors_are_named_for_people(label: str, words: str) -> None:
    assert plain.actor_words(label) == words


def test_a_timeout_says_we_do_not_know_yet_whether_the_refund_was_made() -> None:
    error = AmbiguousError("Read timed out. (read timeout=2)")
    for form in (error, error_json(error), "AmbiguousError: Read timed out… (connection_error)"):
        words = plain.error_words(form)
        assert words.startswith("The payment provider did not answer in time; we do not know yet whether the refund")
        assert "AmbiguousError" not in words


def test_a_missing_charge_is_said_in_words() -> None:
    words = plain.error_words(error_json(NotFoundError("No such charge: 'ch_1'")))
    assert words == "The payment provider has no record of the customer's payment, so no refund can be made on it."


def test_an_unknown_error_points_to_the_technical_details_not_to_a_code() -> None:
    words = plain.error_words({"type": "WeirdThing", "message": "zzz"})
    assert "WeirdThing" not in words and "zzz" not in words
    assert "technical details" in words


@pytest.mark.parametrize(
    "binding", ["order_version", "bill_version", "bill_voided", "balance", "expiry", "amount", "payload_hash"]
)
def test_every_binding_failure_has_a_sentence_without_its_code(binding: str) -> None:
    words = plain.binding_words(binding)
    assert "_" not in words and "Nothing was sent" in words


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("Not done (409). It moved on.", "Not done. It moved on."),
        ("The provider answered HTTP 502: bad gateway", "The provider answered bad gateway"),
        ("Refused (status 403)", "Refused"),
        ("Order 4821 has 450 EUR left", "Order 4821 has 450 EUR left"),
    ],
)
def test_status_codes_are_taken_out_of_messages(text: str, cleaned: str) -> None:
    assert plain.without_status_codes(text) == cleaned


def test_discrepancy_evidence_is_rows_with_money_and_currency() -> None:
    rows = dict(
        plain.evidence_rows(
            {
                "expected": {"amount_minor": 4500, "currency": "EUR"},
                "found": {"amount_minor": 450000, "currency": "JPY"},
                "effects": ["re_1", "re_2"],
                "metadata_action_id": None,
                "amount_minor": 1250,
            },
            currency="EUR",
        )
    )
    assert rows["Expected"] == "45.00 EUR"
    assert rows["Found at the provider"] == "450000 JPY"
    assert rows["Records at the provider"] == "re_1, re_2"
    assert rows["Action named by the provider's record"] == "none"
    assert rows["Amount"] == "12.50 EUR"
    assert "(minor units, currency not recorded)" in plain.minor_to_text(1250, "")


@pytest.mark.parametrize(
    ("record", "words"),
    [
        # The accounting system writes a credit note's total as a JSON number: 40.0.
        ({"CreditNoteID": "cn-1", "Status": "AUTHORISED", "Total": 40.0, "CurrencyCode": "EUR"}, "(40.00 EUR)"),
        ({"CreditNoteID": "cn-2", "Status": "AUTHORISED", "Total": 1200, "CurrencyCode": "JPY"}, "(1,200 JPY)"),
        ({"id": "re_1", "status": "succeeded", "amount": 4050, "currency": "eur"}, "(40.50 EUR)"),
    ],
)
def test_a_lookup_names_the_money_it_found_with_its_currencys_places(record: dict[str, object], words: str) -> None:
    fields = effect_fields(record)
    assert f"({fields['amount']})" == words
