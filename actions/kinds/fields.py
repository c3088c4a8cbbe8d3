"""The checks every proposal's fields go through, shared by the kinds' proposals, the refund
and adjustment requests, and the workflows' templates.

Each check takes the raw value and the list of problems; it appends a ``FieldProblem`` naming
the field for bad input and returns the clean value (or None). A proposal gathers every problem
before it refuses with ``ProposalInvalid``, so the answer names all the bad fields at once, and
nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.conf import settings

from actions.foundation.text import unsafe_characters, unsafe_characters_message
from actions.models import ReasonCode
from actions.providers.money import currency_exponent

# Order numbers and references end up in action ids and idempotency keys, so they are held to
# the key's safe character set from the start.
REFERENCE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$")
AMOUNT_PATTERN = re.compile(r"^[+-]?[0-9]+(\.[0-9]+)?$")
MAX_EVIDENCE_LENGTH = 4000
MAX_AMOUNT_DIGITS = 12  # whole-unit digits: far above any real refund, well inside the column
# Ticket ids from help desks look like "ZD-48213", "#4821" or "support/2024/77".
EXTERNAL_REFERENCE_PATTERN = re.compile(r"^[A-Za-z0-9#][A-Za-z0-9_.:#/@+\-]{0,99}$")
MAX_NOTE_LENGTH = 2000


@dataclass(frozen=True)
class FieldProblem:
    field: str
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "code": self.code, "message": self.message}


class ProposalInvalid(Exception):
    """Bad input: nothing was written. Each problem names its field."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems))

    @classmethod
    def for_field(cls, field: str, code: str, message: str) -> ProposalInvalid:
        """The refusal of one field, for a check that stops at its first problem."""
        return cls([FieldProblem(field, code, message)])


def parse_amount(raw: object, currency: str | None, problems: list[FieldProblem]) -> Decimal | None:
    if isinstance(raw, float | bool):
        problems.append(FieldProblem("amount", "invalid_type", 'Give the amount as a decimal string, e.g. "12.50".'))
        return None
    text = str(raw).strip()
    # Plain decimal notation only: Decimal() would also take "4_0", "4e1" or "NaN", which no
    # person means as an amount of money.
    if not isinstance(raw, Decimal) and not AMOUNT_PATTERN.match(text):
        problems.append(FieldProblem("amount", "invalid", f'{text[:40]!r} is not a decimal amount like "12.50".'))
        return None
    try:
        amount = Decimal(text)
    except (InvalidOperation, ValueError):
        problems.append(FieldProblem("amount", "invalid", f"{str(raw)[:40]!r} is not a decimal amount."))
        return None
    if not amount.is_finite():
        problems.append(FieldProblem("amount", "invalid", "The amount must be a finite number."))
        return None
    if amount <= 0:
        problems.append(FieldProblem("amount", "not_positive", "The amount must be greater than zero."))
        return None
    if amount.adjusted() >= MAX_AMOUNT_DIGITS:
        problems.append(FieldProblem("amount", "too_large", "The amount is implausibly large."))
        return None
    if currency is not None:
        exponent = currency_exponent(currency)
        if -amount.normalize().as_tuple().exponent > exponent:  # type: ignore[operator]
            problems.append(
                FieldProblem(
                    "amount", "too_many_decimals", f"{currency} amounts have at most {exponent} decimal places."
                )
            )
            return None
        return amount.quantize(Decimal(1).scaleb(-exponent))
    return amount


def check_currency(raw: object, problems: list[FieldProblem]) -> str | None:
    currency = str(raw or "").strip().upper()
    if currency not in settings.CONSOLE_CURRENCIES:
        problems.append(
            FieldProblem(
                "currency",
                "unknown_currency",
                f"{str(raw)[:10]!r} is not a currency the console accepts ({', '.join(settings.CONSOLE_CURRENCIES)}).",
            )
        )
        return None
    return currency


def check_reference(name: str, raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw if raw is not None else "").strip()
    if not value:
        problems.append(FieldProblem(name, "required", "This field is required."))
        return None
    if not REFERENCE_PATTERN.match(value):
        problems.append(
            FieldProblem(
                name,
                "invalid_reference",
                "Use 1 to 32 characters: letters, digits, '.', '_' or '-', starting with a letter or digit.",
            )
        )
        return None
    return value


def check_request_number(
    raw: object, problems: list[FieldProblem], *, field: str = "request_number", noun: str = "refund request number"
) -> int | None:
    """The number of a request on its target (a refund request on an order, an adjustment
    request on a bill), named ``noun`` in the messages."""
    if isinstance(raw, bool):
        raw = None
    try:
        number = int(str(raw))
    except (TypeError, ValueError):
        problems.append(FieldProblem(field, "invalid", f"The {noun} must be a whole number."))
        return None
    if not 1 <= number <= 1_000_000:
        problems.append(FieldProblem(field, "out_of_range", f"The {noun} must be at least 1."))
        return None
    return number


def check_reason_code(
    raw: object, problems: list[FieldProblem], *, allowed: Sequence[str] = ReasonCode.values
) -> str | None:
    value = str(raw or "")
    if value not in allowed:
        problems.append(
            FieldProblem(
                "reason_code", "unknown_reason_code", f"Unknown reason code. Use one of: {', '.join(allowed)}."
            )
        )
        return None
    return value


def check_evidence(raw: object, problems: list[FieldProblem]) -> str:
    value = str(raw or "")
    if len(value) > MAX_EVIDENCE_LENGTH:
        problems.append(
            FieldProblem("evidence", "too_long", f"Keep the evidence under {MAX_EVIDENCE_LENGTH} characters.")
        )
    if "\x00" in value:
        problems.append(FieldProblem("evidence", "invalid_characters", "The evidence contains a NUL character."))
    return value


def check_external_reference(raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw if raw is not None else "").strip()
    if not value:
        problems.append(FieldProblem("external_reference", "required", "This field is required."))
        return None
    if not EXTERNAL_REFERENCE_PATTERN.match(value):
        problems.append(
            FieldProblem(
                "external_reference",
                "invalid_reference",
                "Use 1 to 100 characters: letters, digits and _ . : # / @ + -, starting with a letter, digit or #.",
            )
        )
        return None
    return value


def check_note(raw: object, problems: list[FieldProblem]) -> str:
    value = str(raw or "")
    if len(value) > MAX_NOTE_LENGTH:
        problems.append(FieldProblem("note", "too_long", f"Keep the note under {MAX_NOTE_LENGTH} characters."))
    codes = unsafe_characters(value)
    if codes:
        problems.append(FieldProblem("note", "invalid_characters", unsafe_characters_message(codes)))
    return value


@dataclass(frozen=True)
class RequestFieldNames:
    """What a kind calls the two fields that name the request a proposal is for, and the reason
    codes it takes: a refund is for a refund request on an order, an invoice adjustment for an
    adjustment request on a bill."""

    target: str
    request: str
    # The request's number in a clerk's words, for the messages: "refund request number".
    request_noun: str
    reasons: Sequence[str]


@dataclass(frozen=True)
class RequestFields:
    """A proposal's fields for one request on its target (a refund request on an order, an
    adjustment request on a bill), each checked on its own."""

    target_number: str
    request_number: int
    currency: str
    amount: Decimal
    reason_code: str
    evidence: str

    def currency_check(self, held_in: str, *, target_words: str) -> None:
        """The proposal is in its target's currency (``held_in``). ``target_words`` says how the
        target holds it, for the message: "Bill INV-2291 is in", "Order 4821 was paid in"."""
        if self.currency != held_in:
            raise ProposalInvalid.for_field(
                "currency", "currency_mismatch", f"{target_words} {held_in}, not {self.currency}."
            )


def request_fields_check(
    names: RequestFieldNames,
    *,
    target_number: object,
    request_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object,
) -> RequestFields:
    """Each field on its own: every bad one is named at once, before anything is read."""
    problems: list[FieldProblem] = []
    target = check_reference(names.target, target_number, problems)
    number = check_request_number(request_number, problems, field=names.request, noun=names.request_noun)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    reason = check_reason_code(reason_code, problems, allowed=names.reasons)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert target is not None and number is not None and currency_code is not None
    assert money is not None and reason is not None
    return RequestFields(
        target_number=target,
        request_number=number,
        currency=currency_code,
        amount=money,
        reason_code=reason,
        evidence=evidence_text,
    )
