"""Typed views of the API's documents (``/api/v1/openapi.json``), with the raw JSON kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

# Statuses after which nothing changes any more.
FINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED_FINAL", "REJECTED", "CANCELLED"})
# Statuses that wait for a manager's decision rather than for finance or the workers.
DECISION_STATUSES = frozenset({"PROPOSED", "STALE"})


def _datetime(value: Any) -> datetime | None:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None


@dataclass(frozen=True)
class Explanation:
    summary: str
    next_step: str
    held_by: str
    final: bool
    needs_person: bool


@dataclass(frozen=True)
class Action:
    action_id: str
    kind: str
    status: str
    explanation: Explanation
    amount: Decimal
    currency: str
    reason_code: str
    order_number: str | None
    request_number: int | None
    external_reference: str | None
    provider_reference: str | None
    created_at: datetime | None
    updated_at: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES or self.explanation.final

    @property
    def needs_person(self) -> bool:
        return self.explanation.needs_person

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Action:
        explanation = data.get("explanation") or {}
        return cls(
            action_id=str(data["action_id"]),
            kind=str(data.get("kind", "")),
            status=str(data["status"]),
            explanation=Explanation(
                summary=str(explanation.get("summary", "")),
                next_step=str(explanation.get("next_step", "")),
                held_by=str(explanation.get("held_by", "")),
                final=bool(explanation.get("final", False)),
                needs_person=bool(explanation.get("needs_person", False)),
            ),
            amount=Decimal(str(data.get("amount", "0"))),
            currency=str(data.get("currency", "")),
            reason_code=str(data.get("reason_code", "")),
            order_number=data.get("order_number"),
            request_number=data.get("request_number"),
            external_reference=data.get("external_reference"),
            provider_reference=data.get("provider_reference"),
            created_at=_datetime(data.get("created_at")),
            updated_at=_datetime(data.get("updated_at")),
            raw=data,
        )


@dataclass(frozen=True)
class RefundRequest:
    order_number: str
    request_number: int
    external_reference: str | None
    # True when this call opened it; False when the same reference had opened it before.
    created: bool
    raw: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ActionPage:
    items: list[Action]
    next_cursor: str | None
