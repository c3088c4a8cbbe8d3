"""The invoice adjustment's correction: voiding a duplicate credit note, through the same engine.

``credit-note-void`` is a kind of its own, with its own receiver contract (a "set" step: VOIDED
is a declared state). The ledger audit's finding proposes it
(``actions.kinds.invoice_adjustment.corrections``); a manager approves it, never the policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

from actions.kinds.base import (
    Answer,
    Effect,
    EffectKind,
    Explanations,
    LedgerWindow,
    Lookup,
    LookupVerdict,
    Outcome,
    ReceiverContract,
    StepClass,
)
from actions.kinds.invoice_adjustment.contract import ACCOUNTS_PAYABLE, accounting_from_settings
from actions.models import Action, ActionKind, AdjustmentReason
from actions.providers.accounting.client import AccountingClient, CreditNote, CreditNoteStatus
from actions.providers.base import AmbiguousError, NotFoundError, ProviderError
from actions.providers.money import to_minor_units


def credit_note_void_action_id(*, credit_note_id: str) -> str:
    return f"{ActionKind.CREDIT_NOTE_VOID}:{credit_note_id}"


class VoidReceiver:
    """Voiding is a "set" step: VOIDED is a declared state, and setting it twice changes nothing,
    so a lookup by the credit note's id is all reconciliation needs."""

    def __init__(self, client: AccountingClient) -> None:
        self.client = client
        self.contract = ReceiverContract(
            receiver="accounting system",
            # The void carries no key the accounting system keeps: it needs none, the state is
            # the evidence.
            honours_keys=False,
            key_retention=None,
            supports_lookup=True,
            lookup_authoritative=True,
            lookup_visibility_delay=timedelta(0),
            can_settle_later=False,
            step_class=StepClass.SET,
            correction_path="A person re-issues the credit note if a void was wrong.",
        )

    def _effect(self, note: CreditNote, action: Action) -> Effect:
        return Effect(
            reference=note.id,
            status=note.status,
            outcome=Outcome.SUCCEEDED if note.status == CreditNoteStatus.VOIDED else Outcome.NEEDS_REVIEW,
            amount_minor=to_minor_units(note.total, note.currency) if note.currency else None,
            currency=note.currency,
            action_id=action.action_id,
            raw=dict(note.raw),
        )

    def send(self, action: Action) -> Answer:
        try:
            note = self.client.void_credit_note(
                credit_note_id=action.payload["credit_note"], idempotency_key=action.idempotency_key
            )
        except ProviderError as error:
            if isinstance(error, AmbiguousError):
                return Answer(outcome=Outcome.UNKNOWN, error=error)
            return Answer(outcome=Outcome.FAILED_FINAL, error=error)
        return self._effect(note, action).answer()

    def lookup(self, action: Action) -> Lookup:
        try:
            note = self.client.get_credit_note(action.payload["credit_note"])
        except NotFoundError as error:
            return Lookup(LookupVerdict.INCONCLUSIVE, error=error, target_missing=True)
        except ProviderError as error:
            return Lookup(LookupVerdict.INCONCLUSIVE, error=error)
        if note.status != CreditNoteStatus.VOIDED:
            # Authoritative: the state is read by id, with no lag. Not voided yet means the void
            # has not happened, and setting it again is safe.
            return Lookup(LookupVerdict.NOT_FOUND)
        return Lookup(LookupVerdict.FOUND, [self._effect(note, action)])

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        return iter(())


class CreditNoteVoidKind(EffectKind):
    name = ActionKind.CREDIT_NOTE_VOID.value
    label = "Credit note void"
    correction_followup = "The engine then voids the duplicate credit note."
    owner_group = ACCOUNTS_PAYABLE
    explanations = Explanations(
        noun="void",
        succeeded="The accounting system voided the credit note.",
        pending="The accounting system is voiding the credit note.",
        failed="The accounting system's answer proves the credit note cannot be voided",
        on_failure="The duplicate credit note stays on record as a discrepancy for accounts payable.",
    )
    id_pattern = "credit-note-void:<the duplicate credit note's id>"
    example_action_id = "credit-note-void:7d2c9a4e-0b1f-4c55-9a43-1f2e3d4c5b6a"
    binds = "amount, currency, payload hash and expiry (it draws on no balance)"
    # Its effect is a status on a credit note the adjustment kind's ledger already lists.
    has_ledger = False

    def receiver(self) -> VoidReceiver:
        return VoidReceiver(accounting_from_settings())

    def contract(self) -> ReceiverContract:
        return VoidReceiver(accounting_from_settings()).contract

    def request_body(self, action: Action) -> dict[str, Any]:
        return {"credit_note": action.payload.get("credit_note"), "Status": CreditNoteStatus.VOIDED}

    def auto_approval_threshold(self, currency: str) -> Decimal | None:
        return None  # a correction is always a person's decision

    def target_label(self, action: Action) -> str:
        return f"credit note {action.payload.get('credit_note', '-')} (bill {action.payload.get('bill', '-')})"

    def bind_target(self, action: Action, payload: dict[str, Any]) -> None:
        # A void walks back a credit note posted by mistake or as a compensation: always this reason.
        action.reason_code = AdjustmentReason.DUPLICATE_CREDIT_NOTE
