"""The invoice adjustment's correction: proposing the void of a duplicate credit note.

The ledger audit (or reconciliation) finds two credit notes for one adjustment; finance proposes
voiding the one the console did not record (``discrepancy_void_duplicate``). The void is an
action of its own kind (``actions.kinds.invoice_adjustment.void``), approved by a manager and
sent by the same engine.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds import DuplicateCorrection, kind_for
from actions.kinds.fields import REFERENCE_PATTERN, FieldProblem, ProposalInvalid, parse_amount
from actions.kinds.invoice_adjustment.void import credit_note_void_action_id
from actions.models import (
    Action,
    ActionKind,
    AdjustmentReason,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
)
from actions.services import ProposalDraft, ProposalResult, answers_a_lost_proposal_race


@answers_a_lost_proposal_race
def action_propose_credit_note_void(
    *,
    adjustment: Action,
    credit_note_id: str,
    amount: object,
    proposer: Actor,
    note: str,
    now: datetime | None = None,
) -> ProposalResult:
    """Propose voiding a duplicate credit note of ``adjustment`` (the correction path).

    The credit note must not be the one the console recorded as the adjustment's effect: that
    one is the adjustment. A manager approves the void (it is never auto-approved); the engine
    sends it like any other action. ``amount`` is the duplicate's total, as the ledger audit
    or the reconciliation found it.
    """
    now = now or database_clock_now()
    problems: list[FieldProblem] = []
    money = parse_amount(amount, adjustment.currency, problems)
    if not credit_note_id or not REFERENCE_PATTERN.match(credit_note_id[:32]) or len(credit_note_id) > 64:
        problems.append(FieldProblem("credit_note", "invalid_reference", "Give the credit note's id."))
    if kind_for(adjustment.kind).duplicate_correction != DuplicateCorrection.VOID:
        problems.append(FieldProblem("action", "wrong_kind", "Only an invoice adjustment's credit notes are voided."))
    if credit_note_id and credit_note_id == adjustment.provider_reference:
        problems.append(
            FieldProblem(
                "credit_note",
                "is_the_adjustment",
                "This credit note is the adjustment the console recorded; void only the duplicate.",
            )
        )
    if problems:
        raise ProposalInvalid(problems)
    assert money is not None
    with transaction.atomic(durable=True):
        draft = ProposalDraft.compose(
            credit_note_void_action_id(credit_note_id=credit_note_id),
            {
                "kind": ActionKind.CREDIT_NOTE_VOID.value,
                "credit_note": credit_note_id,
                "voids_duplicate_of": adjustment.action_id,
                "bill": adjustment.payload.get("bill"),
                "amount": str(money),
                "currency": adjustment.currency,
            },
        )
        # A correction is never auto-approved: a manager decides.
        return draft.existing_or_record(
            proposer,
            now=now,
            evidence=note,
            evidence_label="note",
            auto_policy=False,
            reason=f"Correction: void the duplicate credit note {credit_note_id} of {adjustment.action_id}.",
            amount=money,
            currency=adjustment.currency,
            reason_code=AdjustmentReason.DUPLICATE_CREDIT_NOTE,
        )


def discrepancy_void_duplicate(*, discrepancy_pk: int, user: Any, note: str, now: datetime | None = None) -> Action:
    """Propose voiding the duplicate credit note that the audit (or reconciliation) found for an
    invoice adjustment. A second call returns the same action.

    The void waits, PROPOSED, for a manager (four eyes; never auto-approved); the engine then sends
    it like any action. The discrepancy moves to IN_PROGRESS and names the void.
    """
    note = note.strip()
    if not note:
        raise ProposalInvalid.for_field("note", "required", "Say why the credit note is voided.")
    with transaction.atomic(durable=True):
        discrepancy = Discrepancy.objects.select_for_update().get(pk=discrepancy_pk)
        linked = discrepancy.details.get("compensating_action")
        if linked:
            return Action.objects.get(action_id=linked)
        if discrepancy.kind != DiscrepancyKind.DUPLICATE_EFFECT or discrepancy.action_id is None:
            raise ProposalInvalid.for_field("discrepancy", "not_a_duplicate", "Only a duplicate is voided.")
        original = Action.objects.get(pk=discrepancy.action_id)
        found = sorted(str(reference) for reference in discrepancy.details.get("effects", []))
        duplicates = [reference for reference in found if reference != original.provider_reference]
        if not original.provider_reference or original.provider_reference not in found or not duplicates:
            raise ProposalInvalid.for_field(
                "discrepancy",
                "original_unresolved",
                "Which credit note is the adjustment is not recorded: resolve the adjustment first.",
            )
    void = action_propose_credit_note_void(
        adjustment=original,
        credit_note_id=duplicates[0],
        amount=original.payload.get("amount", str(original.amount)),
        proposer=Actor.for_user(user),
        note=note,
        now=now,
    ).action
    with transaction.atomic(durable=True):
        discrepancy = Discrepancy.objects.select_for_update().get(pk=discrepancy_pk)
        discrepancy.status = DiscrepancyStatus.IN_PROGRESS
        discrepancy.details = {**discrepancy.details, "compensating_action": void.action_id}
        discrepancy.note = f"{discrepancy.note.rstrip()}\nvoid {void.action_id} proposed: {note}".strip()
        discrepancy.save(update_fields=["status", "details", "note", "updated_at"])
    return void
