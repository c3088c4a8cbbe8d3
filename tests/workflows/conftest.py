"""Fixtures for workflows: a bill with its supplier, an order with a customer, and a scripted
receiver standing in for every kind's receiver, which counts effects per key.

The scripted receiver answers per child key: by default "succeeded" (once per key, like a
receiver that honours keys; a second send of a key returns the first effect), or the answer a
test sets (``script[key] = Outcome.FAILED_FINAL``). Its ``effects`` are the ledger the tests
audit against: one entry per effect that happened.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from actions.engine.dispatch import execution_dispatch
from actions.foundation.trail import Actor
from actions.kinds import kind_for
from actions.kinds.base import Answer, Effect, Lookup, LookupVerdict, Outcome, ReceiverContract
from actions.models import Action, ActionStatus, Bill, Order, Supplier, SupplierContact
from actions.workflows.coordinator import workflow_advance
from tests.factories import make_bill, make_order, make_request


@dataclass
class ScriptedReceiver:
    contract: ReceiverContract
    effects: list[tuple[str, str]]  # (key, reference), in the order they happened
    script: dict[str, Outcome] = field(default_factory=dict)
    sends: list[str] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def send(self, action: Action) -> Answer:
        self.sends.append(action.idempotency_key)
        outcome = self.script.get(action.idempotency_key, Outcome.SUCCEEDED)
        if outcome in (Outcome.FAILED_FINAL, Outcome.NOT_SENT):
            return Answer(outcome=outcome, error=RuntimeError("scripted failure"))
        existing = next((ref for key, ref in self.effects if key == action.idempotency_key), None)
        if existing is None or not self.contract.honours_keys:
            existing = f"ref_{next(self._ids)}"
            self.effects.append((action.idempotency_key, existing))
        if outcome == Outcome.UNKNOWN:
            return Answer(outcome=Outcome.UNKNOWN, error=RuntimeError("scripted timeout after commit"))
        return self._effect(action, existing).answer()

    def _effect(self, action: Action, reference: str) -> Effect:
        return Effect(
            reference=reference,
            status="ok",
            outcome=Outcome.SUCCEEDED,
            amount_minor=None,
            currency="",
            action_id=action.action_id,
        )

    def lookup(self, action: Action) -> Lookup:
        found = [self._effect(action, ref) for key, ref in self.effects if key == action.idempotency_key]
        return Lookup(LookupVerdict.FOUND, found) if found else Lookup(LookupVerdict.NOT_FOUND)

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(())


@dataclass
class World:
    bill: Bill
    order: Order
    supplier: Supplier
    effects: list[tuple[str, str]]
    script: dict[str, Outcome]
    dispatched: list[int]
    nudged: list[str]

    def effects_for(self, key: str) -> int:
        return sum(1 for k, _ in self.effects if k == key)

    def run(self, workflow_id: str, rounds: int = 20) -> str:
        """Play worker: advance the workflow and dispatch what it authorized, until quiet."""
        state = ""
        for _ in range(rounds):
            state = workflow_advance(workflow_id=workflow_id)
            # The test's transaction never commits, so no on-commit publish fires: dispatch
            # what is AUTHORIZED, as the AUTHORIZED sweep would.
            pending = list(Action.objects.filter(status=ActionStatus.AUTHORIZED).values_list("pk", flat=True))
            if not pending:
                break
            for pk in pending:
                execution_dispatch(action_pk=pk)
        return state


@pytest.fixture
def world(transactional_db: Any, monkeypatch: pytest.MonkeyPatch, settings: Any) -> World:
    settings.ACCOUNTING_API_BASE = ""  # the read step reads the console's copy only
    effects: list[tuple[str, str]] = []
    script: dict[str, Outcome] = {}
    receivers: dict[str, ScriptedReceiver] = {}

    def receiver_for(action: Action) -> ScriptedReceiver:
        if action.kind not in receivers:
            receivers[action.kind] = ScriptedReceiver(kind_for(action.kind).contract(), effects, script)
        return receivers[action.kind]

    monkeypatch.setattr("actions.engine.send.receiver_for", receiver_for)
    dispatched: list[int] = []
    nudged: list[str] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", dispatched.append)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", nudged.append)
    bill = make_bill(number="INV-42", amount="200.00")
    supplier = Supplier.objects.create(code="ACME", name="Acme Supplies")
    SupplierContact.objects.create(supplier=supplier, email="ap@acme.example", name="Accounts")
    order = make_order(number="4821", currency="EUR", captured="100.00")
    order.customer_email = "carla@example.com"
    order.save(update_fields=["customer_email"])
    make_request(order, 1)
    return World(bill, order, supplier, effects, script, dispatched, nudged)


def po_parameters(**overrides: Any) -> dict[str, Any]:
    return {
        "bill_number": "INV-42",
        "case": "case-1",
        "amount": "20.00",
        "currency": "EUR",
        "reason_code": "price_mismatch",
        "supplier": "ACME",
        "to": "ap@acme.example",
        "explanation": "Unit price 20.00 on the bill, 18.00 on the purchase order.",
        **overrides,
    }


def refund_parameters(**overrides: Any) -> dict[str, Any]:
    return {
        "order_number": "4821",
        "request_number": 1,
        "case": "ticket-7",
        "amount": "30.00",
        "currency": "EUR",
        "reason_code": "damaged",
        **overrides,
    }


S = ActionStatus
__all__ = ["Actor", "S", "World", "po_parameters", "refund_parameters"]
