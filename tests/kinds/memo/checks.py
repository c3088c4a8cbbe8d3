"""The memo proposal's checks: each field on its own, then the payload. They never write."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from actions.kinds.fields import (
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_reference,
    check_request_number,
    parse_amount,
)
from tests.kinds.memo.contract import MEMO

MAX_TEXT_LENGTH = 200


@dataclass(frozen=True)
class MemoFields:
    topic: str
    number: int
    text: str
    amount: Decimal
    currency: str


def text_check(raw: object, problems: list[FieldProblem]) -> str | None:
    text = str(raw or "").strip()
    if not text or len(text) > MAX_TEXT_LENGTH:
        problems.append(FieldProblem("text", "invalid", f"Write the note in 1 to {MAX_TEXT_LENGTH} characters."))
        return None
    return text


def memo_fields_check(*, topic: object, number: object, text: object, amount: object, currency: object) -> MemoFields:
    """Every bad field is named at once (invariant 11), before anything is read or written."""
    problems: list[FieldProblem] = []
    topic_ref = check_reference("topic", topic, problems)
    note_number = check_request_number(number, problems)
    note_text = text_check(text, problems)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert topic_ref is not None and note_number is not None and note_text is not None
    assert currency_code is not None and money is not None
    return MemoFields(topic=topic_ref, number=note_number, text=note_text, amount=money, currency=currency_code)


def memo_payload(fields: MemoFields) -> dict[str, Any]:
    return {
        "kind": MEMO,
        "topic": fields.topic,
        "n": fields.number,
        "text": fields.text,
        "amount": str(fields.amount),
        "currency": fields.currency,
    }
