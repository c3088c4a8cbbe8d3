"""The invoice-adjustment kind's contract with the engine: a supplier credit note against a bill
in the accounting system.

An agent matches supplier bills against purchase orders; where a bill fails the match it proposes
an adjustment, which the console posts as a credit note (ACCPAYCREDIT) allocated to the bill. The
target is the bill: an approval binds the bill's version, the claim reserves the amount on the
bill's adjustable balance (amount due - adjusted - reserved), a success books it as adjusted, and
a final failure releases it (nobody is owed money, so no remedy opens).

The correction path, ``credit-note-void``, is a kind of its own in ``void.py``: a duplicate
credit note is voided through the same engine, as an action of its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.models import F, Q, Sum

from actions.kinds.base import (
    Answer,
    BindingFailure,
    DuplicateCorrection,
    Effect,
    EffectKind,
    Explanations,
    LedgerUnavailable,
    LedgerWindow,
    Lookup,
    LookupVerdict,
    Outcome,
    ReceiverContract,
    StepClass,
    lookup_from_effects,
)
from actions.kinds.invoice_adjustment.explanations import bill_changes_since
from actions.models import Action, ActionKind, ActionStatus, Bill
from actions.models.actions import RESERVING_STATUSES
from actions.providers.accounting.client import (
    AccountingClient,
    CreateCreditNote,
    CreditNote,
    CreditNoteStatus,
)
from actions.providers.base import (
    AmbiguousError,
    DefinitiveError,
    IdempotencyMismatchError,
    NotFoundError,
    ProviderError,
)
from actions.providers.money import to_minor_units

S = ActionStatus
ACCOUNTS_PAYABLE = "accounts payable"


# --- the answer table ------------------------------------------------------------------------
#
# | accounting system's answer                                          | outcome      |
# |---------------------------------------------------------------------|--------------|
# | created, status AUTHORISED or PAID (allocated to the bill)          | SUCCEEDED    |
# | created, status DRAFT or SUBMITTED (not an adjustment until a       | NEEDS_REVIEW |
# |   person authorises it; it will not settle by itself)               |              |
# | created, status VOIDED or DELETED                                   | FAILED_FINAL |
# | validation error on the first send (over the amount due, voided     | FAILED_FINAL |
# |   bill, wrong currency): nothing was saved and nothing will be      |              |
# | validation error on a resend: an earlier attempt may have used the  | UNKNOWN      |
# |   amount due, so it proves nothing                                  |              |
# | Idempotency-Key reused with a different body                        | NEEDS_REVIEW |
# | key in flight (409), rate limited, 5xx, timeout, connection dropped | UNKNOWN      |
# | credentials refused (401/403)                                       | UNKNOWN      |


def outcome_of_credit_note_status(status: str) -> Outcome:
    if status in (CreditNoteStatus.AUTHORISED, CreditNoteStatus.PAID):
        return Outcome.SUCCEEDED
    if status in (CreditNoteStatus.VOIDED, CreditNoteStatus.DELETED):
        return Outcome.FAILED_FINAL
    # DRAFT, SUBMITTED or a word this table does not know: a person must look. Nothing in the
    # receiver's contract says it will become an adjustment on its own.
    return Outcome.NEEDS_REVIEW


def effect_from_credit_note(note: CreditNote) -> Effect:
    return Effect(
        reference=note.id,
        status=note.status,
        outcome=outcome_of_credit_note_status(note.status),
        amount_minor=to_minor_units(note.total, note.currency) if note.currency else None,
        currency=note.currency,
        action_id=note.reference or None,
        raw=dict(note.raw),
        created=note.created,
    )


def answer_from_create_error(error: ProviderError, *, resend: bool) -> Answer:
    """Classify an error raised by create_credit_note. ``resend``: an earlier attempt exists."""
    if isinstance(error, IdempotencyMismatchError):
        return Answer(outcome=Outcome.NEEDS_REVIEW, error=error)
    if isinstance(error, AmbiguousError):
        return Answer(outcome=Outcome.UNKNOWN, error=error)
    if isinstance(error, DefinitiveError | NotFoundError):
        # On a resend the bill's amount due may be gone because the first attempt succeeded
        # (past key retention the accounting system does not replay): that is not a failure.
        return Answer(outcome=Outcome.UNKNOWN if resend else Outcome.FAILED_FINAL, error=error)
    return Answer(outcome=Outcome.UNKNOWN, error=error)


# --- the receiver ----------------------------------------------------------------------------


def adjustment_contract() -> ReceiverContract:
    return ReceiverContract(
        receiver="accounting system",
        honours_keys=True,
        key_retention=timedelta(seconds=settings.ACCOUNTING_KEY_RETENTION_SECONDS),
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=timedelta(seconds=settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS),
        can_settle_later=False,
        step_class=StepClass.CREATE,
        correction_path="A duplicate credit note is voided by a credit-note-void action through the same "
        "engine; accounts payable owns what cannot be established.",
    )


@lru_cache(maxsize=1)
def accounting_from_settings() -> AccountingClient:
    """One accounting client per process, built from settings (the sandbox in development and tests)."""
    return AccountingClient(
        api_base=settings.ACCOUNTING_API_BASE,
        access_token=settings.ACCOUNTING_ACCESS_TOKEN,
        tenant_id=settings.ACCOUNTING_TENANT_ID,
        timeout_seconds=settings.ACCOUNTING_TIMEOUT_SECONDS,
    )


def credit_note_request_for(action: Action) -> CreateCreditNote:
    payload = action.payload
    return CreateCreditNote(
        idempotency_key=action.idempotency_key,
        # The Reference carries the action id, so a lookup by Reference finds it.
        reference=action.action_id,
        contact_name=payload["supplier"],
        invoice_id=payload["invoice_id"],
        currency=action.currency,
        amount=action.amount,
        description=f"Adjustment {payload['adjustment']} to bill {payload['bill']} ({action.reason_code})",
    )


class AdjustmentReceiver:
    """The accounting system, spoken to in the engine's words (send, lookup, ledger)."""

    def __init__(self, client: AccountingClient) -> None:
        self.client = client
        self.contract = adjustment_contract()

    def send(self, action: Action) -> Answer:
        try:
            effect = effect_from_credit_note(self.client.create_credit_note(credit_note_request_for(action)))
        except ProviderError as error:
            # attempt_count counts this attempt too: above one, an earlier send exists.
            return answer_from_create_error(error, resend=action.attempt_count > 1)
        return Answer(outcome=effect.outcome, effect=effect)

    def lookup(self, action: Action) -> Lookup:
        try:
            notes = self.client.find_credit_notes(reference=action.action_id)
        except ProviderError as error:
            return Lookup(LookupVerdict.INCONCLUSIVE, error=error)
        # A voided duplicate is history, not an effect: only live credit notes count.
        effects = [effect_from_credit_note(note) for note in notes]
        live = [effect for effect in effects if effect.outcome != Outcome.FAILED_FINAL]
        return lookup_from_effects(live or effects[:1])

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        created_from, created_before = (window.start, window.end) if window is not None else (None, None)
        try:
            for note in self.client.iter_ledger(created_from=created_from, created_before=created_before):
                yield effect_from_credit_note(note)
        except ProviderError as error:
            raise LedgerUnavailable(str(error)) from error


def credit_notes_by_bill(effects: list[Effect]) -> dict[str, list[Effect]]:
    """The ledger listed per bill (the accounting system's InvoiceID), for pages and audits."""
    listing: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        allocations = effect.raw.get("Allocations") or []
        invoice = allocations[0].get("Invoice", {}).get("InvoiceID") if allocations else effect.raw.get("InvoiceID")
        listing[str(invoice or "")].append(effect)
    return dict(listing)


# --- the kind --------------------------------------------------------------------------------


def invoice_adjustment_action_id(*, bill_number: str, adjustment_number: int) -> str:
    """The action id names the business action; it is composed here and nowhere else."""
    return f"{ActionKind.INVOICE_ADJUSTMENT}:bill-{bill_number}:adjustment-{adjustment_number}"


class InvoiceAdjustmentKind(EffectKind):
    name = ActionKind.INVOICE_ADJUSTMENT.value
    label = "Invoice adjustment"
    duplicate_correction = DuplicateCorrection.VOID
    owner_group = ACCOUNTS_PAYABLE
    explanations = Explanations(
        noun="credit note",
        succeeded="The accounting system saved the credit note and allocated it to the bill.",
        pending="The accounting system accepted the credit note; its final status is pending.",
        failed="The accounting system's answer proves the credit note was not saved and will not be",
        on_failure="The reservation on the bill is released; the supplier's bill stays as it was.",
    )
    id_pattern = "invoice-adjustment:bill-<bill number>:adjustment-<adjustment request number>"
    example_action_id = "invoice-adjustment:bill-INV-2291:adjustment-1"
    binds = "the bill's version, amount, currency, payload hash and expiry"

    def ledger_enabled(self) -> bool:
        # ACCOUNTING_API_BASE="" means this deployment has no accounting system.
        return bool(settings.ACCOUNTING_API_BASE)

    def receiver(self) -> AdjustmentReceiver:
        return AdjustmentReceiver(accounting_from_settings())

    def contract(self) -> ReceiverContract:
        return adjustment_contract()

    def request_body(self, action: Action) -> dict[str, Any]:
        return {"idempotency_key": action.idempotency_key, **credit_note_request_for(action).body()}

    def lookup_request(self, action: Action) -> dict[str, Any]:
        return {"where": f'Reference=="{action.action_id}"', "action_id": action.action_id, "for_status": action.status}

    def expected_amount_minor(self, action: Action) -> int | None:
        return to_minor_units(action.amount, action.currency)

    def target_label(self, action: Action) -> str:
        return f"bill {action.payload.get('bill', '-')}"

    def bind_target(self, action: Action, payload: dict[str, Any]) -> None:
        action.bill = Bill.objects.get(number=payload["bill"])

    # --- auto-approval: its own thresholds, and a cap per bill ------------------------------

    def auto_approval_threshold(self, currency: str) -> Decimal | None:
        return settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS.get(currency)

    def auto_approval_refusal(self, action: Action) -> str | None:
        bill = Bill.objects.get(pk=_bill_pk(action))
        if bill.voided:
            return "the bill is voided"
        if action.amount > bill.adjustable_amount:
            return "the bill no longer covers it"
        cap = settings.INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP.get(action.currency)
        if cap is None:
            return "no per-bill cap is set for this currency"
        # Many small adjustments must not add up to a large one nobody looked at.
        already = Action.objects.filter(bill_id=bill.pk, approvals__policy="auto_threshold").exclude(
            pk=action.pk
        ).exclude(status__in=[S.FAILED_FINAL, S.REJECTED, S.CANCELLED]).distinct().aggregate(total=Sum("amount"))[
            "total"
        ] or Decimal("0")
        if already + action.amount > cap:
            return f"auto-approved adjustments on this bill would exceed {cap} {action.currency}"
        return None

    # --- binding and reservation on the bill -------------------------------------------------

    def target_version(self, action: Action) -> int | None:
        return Bill.objects.values_list("version", flat=True).get(pk=_bill_pk(action))

    def target_balance(self, action: Action) -> tuple[str, Decimal] | None:
        bill = action.bill
        assert bill is not None, "an invoice adjustment always targets a bill"
        return (f"bill {bill.number}'s adjustable balance", Decimal("0") if bill.voided else bill.adjustable_amount)

    def target_changed_words(self, action: Action, *, shown_version: int | None) -> str:
        bill = action.bill
        assert bill is not None, "an invoice adjustment always targets a bill"
        changes = bill_changes_since(bill, shown_version) if shown_version is not None else []
        return (
            f"Bill {bill.number} changed since you opened this page: "
            f"{'; '.join(changes or ['its details were changed'])}. "
            f"It now has {bill.adjustable_amount} {bill.currency} left to adjust."
        )

    def approval_refusal(self, action: Action) -> tuple[str, str] | None:
        # The inbox selects the bill with the action: no query per row.
        bill = action.bill
        assert bill is not None, "an invoice adjustment always targets a bill"
        if bill.voided:
            return ("bill_voided", f"Bill {bill.number} is voided: it cannot be adjusted.")
        if action.amount > bill.adjustable_amount:
            return (
                "over_adjustable_balance",
                f"Bill {bill.number} has only {bill.adjustable_amount} {bill.currency} left to adjust.",
            )
        return None

    def reserve(self, action: Action, *, approved_version: int | None) -> list[BindingFailure]:
        """Reserve only if the bill is still at the approved version, not voided, and covers it."""
        assert approved_version is not None, "an adjustment's approval binds the bill's version"
        reserved = Bill.objects.filter(
            pk=_bill_pk(action),
            version=approved_version,
            voided=False,
            amount_due__gte=F("adjusted_amount") + F("reserved_amount") + action.amount,
        ).update(reserved_amount=F("reserved_amount") + action.amount, version=F("version") + 1)
        if reserved:
            return []
        bill = Bill.objects.get(pk=_bill_pk(action))
        if bill.version != approved_version:
            return [
                BindingFailure(
                    "bill_version",
                    f"The bill changed since the approval (approved at version {approved_version}, "
                    f"now {bill.version}).",
                )
            ]
        if bill.voided:
            return [BindingFailure("bill_voided", f"Bill {bill.number} was voided since the approval.")]
        return [
            BindingFailure(
                "balance",
                f"The bill's adjustable balance {bill.adjustable_amount} {bill.currency} no longer covers "
                f"{action.amount}.",
            )
        ]

    def book_success(self, action: Action) -> None:
        """SUCCEEDED: the reserved amount becomes an adjustment of the bill, in the same transaction."""
        Bill.objects.filter(pk=_bill_pk(action)).update(
            reserved_amount=F("reserved_amount") - action.amount,
            adjusted_amount=F("adjusted_amount") + action.amount,
        )

    def release(self, action: Action) -> None:
        """FAILED_FINAL: the reservation is released; the bill stays as it was."""
        Bill.objects.filter(pk=_bill_pk(action)).update(reserved_amount=F("reserved_amount") - action.amount)

    def money_violations(self) -> tuple[int, list[tuple[str, str]]]:
        """Per bill: adjusted = sum of SUCCEEDED adjustments; reserved = sum over live ones; and
        adjusted + reserved <= the amount due (invariant 5, for bills)."""
        adjustments = Action.objects.filter(kind=self.name)
        succeeded = dict(
            adjustments.filter(status=S.SUCCEEDED).values_list("bill_id").annotate(total=Sum("amount")).order_by()
        )
        reserved = dict(
            adjustments.filter(status__in=RESERVING_STATUSES)
            .values_list("bill_id")
            .annotate(total=Sum("amount"))
            .order_by()
        )
        bills = Bill.objects.filter(
            Q(pk__in=succeeded.keys()) | Q(pk__in=reserved.keys()) | ~Q(adjusted_amount=0) | ~Q(reserved_amount=0)
        )
        problems: list[tuple[str, str]] = []
        count = 0
        for bill in bills.iterator(chunk_size=2000):
            count += 1
            want_adjusted = succeeded.get(bill.pk) or Decimal("0")
            want_reserved = reserved.get(bill.pk) or Decimal("0")
            subject = f"bill-{bill.number}"
            if bill.adjusted_amount != want_adjusted:
                problems.append(
                    (subject, f"adjusted {bill.adjusted_amount} but SUCCEEDED adjustments sum to {want_adjusted}")
                )
            if bill.reserved_amount != want_reserved:
                problems.append(
                    (subject, f"reserved {bill.reserved_amount} but live adjustments sum to {want_reserved}")
                )
            if bill.adjusted_amount + bill.reserved_amount > bill.amount_due:
                problems.append((subject, "adjusted + reserved exceeds the amount due"))
        return count, problems


def _bill_pk(action: Action) -> int:
    assert action.bill_id is not None, "an invoice adjustment always targets a bill"
    return action.bill_id
