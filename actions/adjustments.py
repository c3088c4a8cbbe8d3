"""Services for invoice adjustments: adjustment requests on bills, proposals, and the correction.

Shaped like refunds (``actions.requests`` and ``action_propose_refund``): deterministic
validation first (bad input writes nothing and names its field), then ``proposal_record``, the
generic proposal skeleton every kind shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from actions.foundation.trail import Actor
from actions.kinds import DuplicateCorrection, kind_for
from actions.kinds.fields import (
    REFERENCE_PATTERN,
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_evidence,
    check_external_reference,
    check_note,
    parse_amount,
)
from actions.kinds.invoice_adjustment import credit_note_void_action_id, invoice_adjustment_action_id
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    AdjustmentReason,
    AdjustmentRequest,
    Agent,
    Bill,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
)
from actions.providers.base import validate_idempotency_key
from actions.services import (
    ProposalResult,
    answers_a_lost_proposal_race,
    existing_or_conflict,
    payload_hash,
    payload_versioned,
    proposal_record,
)

S = ActionStatus


def _check_bill_number(raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw if raw is not None else "").strip()
    if not value:
        problems.append(FieldProblem("bill_number", "required", "This field is required."))
        return None
    if not REFERENCE_PATTERN.match(value):
        problems.append(
            FieldProblem(
                "bill_number",
                "invalid_reference",
                "Use 1 to 32 characters: letters, digits, '.', '_' or '-', starting with a letter or digit.",
            )
        )
        return None
    return value


def _check_adjustment_number(raw: object, problems: list[FieldProblem]) -> int | None:
    if isinstance(raw, bool):
        raw = None
    try:
        number = int(str(raw))
    except (TypeError, ValueError):
        problems.append(FieldProblem("adjustment_number", "invalid", "The adjustment number must be a whole number."))
        return None
    if not 1 <= number <= 1_000_000:
        problems.append(FieldProblem("adjustment_number", "out_of_range", "The adjustment number must be at least 1."))
        return None
    return number


def _check_adjustment_reason(raw: object, problems: list[FieldProblem]) -> str | None:
    value = str(raw or "")
    allowed = [reason for reason in AdjustmentReason.values if reason != AdjustmentReason.DUPLICATE_CREDIT_NOTE]
    if value not in allowed:
        problems.append(
            FieldProblem(
                "reason_code", "unknown_reason_code", f"Unknown reason code. Use one of: {', '.join(allowed)}."
            )
        )
        return None
    return value


# --- adjustment requests ------------------------------------------------------------------------


class AdjustmentRequestConflict(Exception):
    """The external reference already names an adjustment request on another bill."""

    def __init__(self, request: AdjustmentRequest, differing: dict[str, dict[str, Any]]) -> None:
        self.request = request
        self.differing = differing
        super().__init__(
            f"The external reference {request.external_reference!r} already belongs to an adjustment request on "
            f"bill {request.bill.number}. One mismatch is one request: use another reference for another bill."
        )


class AdjustmentRequestTaken(Exception):
    """The external reference names a request another agent opened. Nothing is revealed about it."""


@dataclass(frozen=True)
class AdjustmentRequestResult:
    request: AdjustmentRequest
    created: bool


def adjustment_request_open(
    *, bill_number: object, external_reference: object, note: object = "", opened_by_agent: Agent | None = None
) -> AdjustmentRequestResult:
    """Open the next adjustment request on a bill, or return the one this reference opened.

    Idempotent by external reference (the matcher's exception id); numbered per bill under the
    bill's row lock, so two requests on one bill are numbered one after the other. A request
    opened by an agent records it, and another agent cannot read it back by its reference
    (AdjustmentRequestTaken) nor propose against it.
    """
    problems: list[FieldProblem] = []
    bill_ref = _check_bill_number(bill_number, problems)
    reference = check_external_reference(external_reference, problems)
    note_text = check_note(note, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert bill_ref is not None and reference is not None

    with transaction.atomic(durable=True):
        bill = Bill.objects.select_for_update().filter(number=bill_ref).first()
        if bill is None:
            raise ProposalInvalid([FieldProblem("bill_number", "not_found", f"There is no bill {bill_ref}.")])
        existing = AdjustmentRequest.objects.select_related("bill").filter(external_reference=reference).first()
        if existing is not None:
            return _request_or_conflict(existing, bill.number, opened_by_agent=opened_by_agent)
        number = (AdjustmentRequest.objects.filter(bill=bill).aggregate(top=Max("number"))["top"] or 0) + 1
        try:
            with transaction.atomic():
                request = AdjustmentRequest.objects.create(
                    bill=bill,
                    number=number,
                    external_reference=reference,
                    note=note_text,
                    opened_by_agent=opened_by_agent,
                )
        except IntegrityError:
            winner = AdjustmentRequest.objects.select_related("bill").filter(external_reference=reference).first()
            if winner is None:
                raise
            return _request_or_conflict(winner, bill.number, opened_by_agent=opened_by_agent)
        return AdjustmentRequestResult(request=request, created=True)


def _request_or_conflict(
    request: AdjustmentRequest, bill_number: str, *, opened_by_agent: Agent | None = None
) -> AdjustmentRequestResult:
    if opened_by_agent is not None and request.opened_by_agent_id not in (None, opened_by_agent.pk):
        raise AdjustmentRequestTaken(request.external_reference)
    if request.bill.number == bill_number:
        return AdjustmentRequestResult(request=request, created=False)
    raise AdjustmentRequestConflict(
        request, {"bill_number": {"existing": request.bill.number, "proposed": bill_number}}
    )


# --- proposals ----------------------------------------------------------------------------------


@answers_a_lost_proposal_race
def action_propose_invoice_adjustment(
    *,
    bill_number: object,
    adjustment_number: object,
    amount: object,
    currency: object,
    reason_code: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate an invoice adjustment deterministically and record it.

    - Bad input raises ProposalInvalid naming the field and writes nothing (invariant 11): an
      unknown bill or request, a voided bill, another currency than the bill's, an amount above
      the bill's adjustable balance (amount due - adjusted - reserved).
    - The same action id with the same payload returns the existing action; with another payload
      it raises ProposalConflict naming the fields.
    - Below the kind's auto-approval threshold (and the per-bill cap) the policy approves it in
      the same transaction.
    """
    now = now or timezone.now()
    problems: list[FieldProblem] = []
    bill_ref = _check_bill_number(bill_number, problems)
    number = _check_adjustment_number(adjustment_number, problems)
    currency_code = check_currency(currency, problems)
    money = parse_amount(amount, currency_code, problems)
    reason = _check_adjustment_reason(reason_code, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert bill_ref is not None and number is not None and currency_code is not None
    assert money is not None and reason is not None

    with transaction.atomic(durable=True):
        bill = Bill.objects.filter(number=bill_ref).first()
        if bill is None:
            raise ProposalInvalid([FieldProblem("bill_number", "not_found", f"There is no bill {bill_ref}.")])
        # Another agent's request reads as no request, with the same answer as a number that
        # does not exist.
        request = AdjustmentRequest.objects.visible_to(proposer.agent).filter(bill=bill, number=number).first()
        if request is None:
            raise ProposalInvalid(
                [FieldProblem("adjustment_number", "not_found", f"Bill {bill_ref} has no adjustment request {number}.")]
            )
        if not bill.accounting_reference:
            raise ProposalInvalid(
                [FieldProblem("bill_number", "not_in_accounting", f"Bill {bill_ref} is not in the accounting system.")]
            )
        if currency_code != bill.currency:
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "currency", "currency_mismatch", f"Bill {bill_ref} is in {bill.currency}, not {currency_code}."
                    )
                ]
            )

        action_id = invoice_adjustment_action_id(bill_number=bill.number, adjustment_number=request.number)
        validate_idempotency_key(action_id)
        payload = payload_versioned({
            "kind": ActionKind.INVOICE_ADJUSTMENT.value,
            "bill": bill.number,
            "adjustment": request.number,
            "invoice_id": bill.accounting_reference,
            "supplier": bill.supplier_name,
            "amount": str(money),
            "currency": currency_code,
            "reason_code": reason,
        })
        digest = payload_hash(payload)
        # An identical retry returns what exists before any check its own reservation could fail.
        existing = Action.objects.filter(action_id=action_id).first()
        if existing is not None:
            return existing_or_conflict(existing, payload, digest)

        if bill.voided:
            raise ProposalInvalid([FieldProblem("bill_number", "bill_voided", f"Bill {bill_ref} is voided.")])
        if money > bill.adjustable_amount:
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "amount",
                        "over_adjustable_balance",
                        f"{money} {currency_code} is more than the adjustable balance of bill {bill_ref} "
                        f"({bill.adjustable_amount} {currency_code}: amount due {bill.amount_due}, "
                        f"adjusted {bill.adjusted_amount}, reserved {bill.reserved_amount}).",
                    )
                ]
            )

        actor_user = proposer.accountable_user
        action = Action(
            action_id=action_id,
            kind=ActionKind.INVOICE_ADJUSTMENT,
            idempotency_key=action_id,
            payload=payload,
            payload_hash=digest,
            bill=bill,
            adjustment_request=request,
            amount=money,
            currency=currency_code,
            reason_code=reason,
            evidence=evidence_text,
            proposed_by_agent=proposer.agent,
            proposed_by_user=actor_user if getattr(actor_user, "pk", None) else None,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=[],
            event_evidence={"payload": payload, "payload_hash": digest, "evidence": evidence_text},
            auto_policy=True,
            savepoint=False,
        )


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
    now = now or timezone.now()
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
        action_id = credit_note_void_action_id(credit_note_id=credit_note_id)
        validate_idempotency_key(action_id)
        payload = payload_versioned({
            "kind": ActionKind.CREDIT_NOTE_VOID.value,
            "credit_note": credit_note_id,
            "voids_duplicate_of": adjustment.action_id,
            "bill": adjustment.payload.get("bill"),
            "amount": str(money),
            "currency": adjustment.currency,
        })
        digest = payload_hash(payload)
        existing = Action.objects.filter(action_id=action_id).first()
        if existing is not None:
            return existing_or_conflict(existing, payload, digest)
        action = Action(
            action_id=action_id,
            kind=ActionKind.CREDIT_NOTE_VOID,
            idempotency_key=action_id,
            payload=payload,
            payload_hash=digest,
            amount=money,
            currency=adjustment.currency,
            reason_code=AdjustmentReason.DUPLICATE_CREDIT_NOTE,
            evidence=note,
            proposed_by_user=proposer.accountable_user if getattr(proposer.accountable_user, "pk", None) else None,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=[],
            event_evidence={"payload": payload, "payload_hash": digest, "note": note},
            auto_policy=False,
            reason=f"Correction: void the duplicate credit note {credit_note_id} of {adjustment.action_id}.",
            savepoint=False,
        )


# --- the correction, from the ledger audit's finding ---------------------------------------------


def discrepancy_void_duplicate(*, discrepancy_pk: int, user: Any, note: str, now: datetime | None = None) -> Action:
    """Propose voiding the duplicate credit note that the audit (or reconciliation) found for an
    invoice adjustment. A second call returns the same action.

    The void waits, PROPOSED, for a manager (four eyes; never auto-approved); the engine then sends
    it like any action. The discrepancy moves to IN_PROGRESS and names the void.
    """
    note = note.strip()
    if not note:
        raise ProposalInvalid([FieldProblem("note", "required", "Say why the credit note is voided.")])
    with transaction.atomic(durable=True):
        discrepancy = Discrepancy.objects.select_for_update().get(pk=discrepancy_pk)
        linked = discrepancy.details.get("compensating_action")
        if linked:
            return Action.objects.get(action_id=linked)
        if discrepancy.kind != DiscrepancyKind.DUPLICATE_EFFECT or discrepancy.action_id is None:
            raise ProposalInvalid([FieldProblem("discrepancy", "not_a_duplicate", "Only a duplicate is voided.")])
        original = Action.objects.get(pk=discrepancy.action_id)
        found = sorted(str(reference) for reference in discrepancy.details.get("effects", []))
        duplicates = [reference for reference in found if reference != original.provider_reference]
        if not original.provider_reference or original.provider_reference not in found or not duplicates:
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "discrepancy",
                        "original_unresolved",
                        "Which credit note is the adjustment is not recorded: resolve the adjustment first.",
                    )
                ]
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
