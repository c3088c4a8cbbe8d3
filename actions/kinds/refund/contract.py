"""The refund kind's contract with the engine: money back to a customer through the payment provider.

Its target is the order: an approval binds the order's version, the claim reserves the amount
on the order's refundable balance (captured - refunded - reserved), a success books it as
refunded, and a final failure releases it and opens a remedy, because the customer still
expects their money.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.models import Q, Sum

from actions.foundation import sql
from actions.foundation.owners import owner_pick
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
from actions.kinds.refund.explanations import order_changes_since, outside_refunds_since
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    Order,
    OutsideRefund,
    RefundRequest,
    Remedy,
    RemedyKind,
)
from actions.models.actions import RESERVING_STATUSES
from actions.providers.base import (
    AmbiguousError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    NotFoundError,
    Provider,
    ProviderError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
)
from actions.providers.money import to_minor_units
from actions.providers.stripe_adapter import StripeProvider, stripe_guarantees

S = ActionStatus


# --- the answer table (docs/architecture.md section 6) --------------------------------------------------
#
# | receiver answer                                                   | outcome      |
# |-------------------------------------------------------------------|--------------|
# | created, status succeeded                                         | SUCCEEDED    |
# | created, status pending (or requires_action)                      | PENDING      |
# | created, status failed or canceled                                | FAILED_FINAL |
# | validation error proving nothing was and nothing will be executed | FAILED_FINAL |
# | an error that may mean an earlier attempt already succeeded       | UNKNOWN      |
# | idempotency key reused with different parameters                  | NEEDS_REVIEW |
# | key in use, rate limited, 5xx, timeout, connection dropped        | UNKNOWN      |


def outcome_of_refund_status(status: RefundStatus) -> Outcome:
    if status == RefundStatus.SUCCEEDED:
        return Outcome.SUCCEEDED
    if status in (RefundStatus.FAILED, RefundStatus.CANCELED):
        return Outcome.FAILED_FINAL
    # pending and requires_action: the receiver has it; its final status comes later.
    return Outcome.PENDING


def effect_from_refund(refund: ProviderRefund) -> Effect:
    return Effect(
        reference=refund.id,
        status=str(refund.status),
        outcome=outcome_of_refund_status(refund.status),
        amount_minor=refund.amount_minor,
        currency=refund.currency.upper(),
        action_id=refund.action_id,
        raw=dict(refund.raw),
        created=datetime.fromtimestamp(refund.created, tz=UTC),
    )


def answer_from_refund(refund: ProviderRefund) -> Answer:
    effect = effect_from_refund(refund)
    return Answer(outcome=effect.outcome, effect=effect)


def answer_from_submission_error(error: ProviderError) -> Answer:
    """Classify an error raised by create_refund."""
    if isinstance(error, IdempotencyMismatchError):
        return Answer(outcome=Outcome.NEEDS_REVIEW, error=error)
    if isinstance(error, AmbiguousError):
        return Answer(outcome=Outcome.UNKNOWN, error=error)
    if isinstance(error, DefinitiveError | NotFoundError):
        return Answer(outcome=Outcome.FAILED_FINAL, error=error)
    # An error type this table does not know proves nothing: treat it as ambiguous.
    return Answer(outcome=Outcome.UNKNOWN, error=error)


# --- the receiver: the payment provider behind the engine's vocabulary -------------------------


def refund_request_for(action: Action) -> CreateRefund:
    return CreateRefund(
        idempotency_key=action.idempotency_key,
        charge=action.payload["charge"],
        amount_minor=to_minor_units(action.amount, action.currency),
        currency=action.currency.lower(),
        metadata={"action_id": action.action_id},
    )


def refund_contract(guarantees: ProviderGuarantees) -> ReceiverContract:
    """A payment provider's guarantees, in the engine's words."""
    return ReceiverContract(
        receiver="provider",
        honours_keys=guarantees.honours_idempotency_keys,
        key_retention=guarantees.key_retention,
        supports_lookup=guarantees.supports_lookup,
        lookup_authoritative=guarantees.lookup_authoritative,
        lookup_visibility_delay=guarantees.lookup_visibility_delay,
        can_settle_later=True,
        step_class=StepClass.IRREVERSIBLE,
        correction_path="A failed refund opens a remedy (store credit, transfer, cheque); a duplicate refund "
        "is recovered by a compensating action that finance records.",
    )


def configured_guarantees() -> ProviderGuarantees:
    """What the configured provider (Stripe, or its sandbox) guarantees, from settings alone, so
    deciding a schedule never needs a client."""
    return stripe_guarantees(
        key_retention=timedelta(seconds=settings.PROVIDER_KEY_RETENTION_SECONDS),
        lookup_visibility_delay=timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
    )


class RefundReceiver:
    """The payment provider, spoken to in the engine's words (send, lookup, ledger)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.contract = refund_contract(provider.guarantees)

    def send(self, action: Action) -> Answer:
        try:
            return answer_from_refund(self.provider.create_refund(refund_request_for(action)))
        except ProviderError as error:
            return answer_from_submission_error(error)

    def lookup(self, action: Action) -> Lookup:
        try:
            if action.status == S.SETTLING and action.provider_reference:
                return Lookup(
                    LookupVerdict.FOUND, [effect_from_refund(self.provider.get_refund(action.provider_reference))]
                )
            refunds = self.provider.find_refunds(charge=action.payload.get("charge", ""), action_id=action.action_id)
        except NotFoundError as error:
            # The charge itself is missing: that proves nothing about our refund, ask a person.
            return Lookup(LookupVerdict.INCONCLUSIVE, error=error, target_missing=True)
        except ProviderError as error:
            return Lookup(LookupVerdict.INCONCLUSIVE, error=error)
        return lookup_from_effects([effect_from_refund(refund) for refund in refunds])

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        created_from, created_before = window.epoch_seconds() if window is not None else (None, None)
        try:
            for refund in self.provider.iter_ledger(created_from=created_from, created_before=created_before):
                yield effect_from_refund(refund)
        except ProviderError as error:
            raise LedgerUnavailable(str(error)) from error


@lru_cache(maxsize=1)
def provider_from_settings() -> Provider:
    """One payment provider per process, built from settings (the sandbox in development and tests)."""
    return StripeProvider(
        api_key=settings.PROVIDER_API_KEY,
        api_base=settings.PROVIDER_API_BASE,
        timeout_seconds=settings.PROVIDER_TIMEOUT_SECONDS,
        key_retention=timedelta(seconds=settings.PROVIDER_KEY_RETENTION_SECONDS),
        lookup_visibility_delay=timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
        verify_charge_currency=settings.PROVIDER_VERIFY_CHARGE_CURRENCY,
    )


# --- the kind ---------------------------------------------------------------------------------


def refund_action_id(*, order_number: str, request_number: int) -> str:
    """The action id names the business action; it is composed here and nowhere else."""
    return f"{ActionKind.REFUND}:order-{order_number}:request-{request_number}"


class RefundKind(EffectKind):
    name = ActionKind.REFUND.value
    label = "Refund"
    duplicate_correction = DuplicateCorrection.RECOVER
    explanations = Explanations(
        noun="refund",
        succeeded="The payment provider confirmed the refund.",
        pending="The payment provider accepted the refund; its final status is pending.",
        failed="The payment provider's answer proves the refund did not and will not happen",
        on_failure="The reservation is released and a remedy opens: the customer still expects their money.",
    )
    id_pattern = "refund:order-<order number>:request-<refund request number>"
    example_action_id = "refund:order-4821:request-3"
    binds = "the order's version, amount, currency, payload hash and expiry"
    failure_choices = tuple(
        (choice.value, str(choice.label))
        for choice in (RemedyKind.STORE_CREDIT, RemedyKind.MANUAL_TRANSFER, RemedyKind.CHEQUE, RemedyKind.NONE)
    )

    def receiver(self) -> RefundReceiver:
        return RefundReceiver(provider_from_settings())

    def contract(self) -> ReceiverContract:
        return refund_contract(configured_guarantees())

    def request_body(self, action: Action) -> dict[str, Any]:
        return {
            "charge": action.payload.get("charge", ""),
            "amount": action.payload["amount"],
            "currency": action.currency,
            "idempotency_key": action.idempotency_key,
            "metadata": {"action_id": action.action_id},
        }

    def lookup_request(self, action: Action) -> dict[str, Any]:
        return {
            "charge": action.payload.get("charge", ""),
            "action_id": action.action_id,
            "refund_id": action.provider_reference,
            "for_status": action.status,
        }

    def expected_amount_minor(self, action: Action) -> int | None:
        return to_minor_units(action.amount, action.currency)

    def target_label(self, action: Action) -> str:
        return f"order {action.payload.get('order', '-')}"

    def bind_target(self, action: Action, payload: dict[str, Any]) -> None:
        request = RefundRequest.objects.select_related("order").get(
            order__number=payload["order"], number=payload["request"]
        )
        action.order = request.order
        action.refund_request = request

    # --- binding and reservation on the order ------------------------------------------

    def target_version(self, action: Action) -> int | None:
        # The order as the caller loaded it in its transaction (select_related, or the proposal's
        # own read): the version the decider saw.
        assert action.order is not None, "a refund always targets an order"
        return action.order.version

    def target_changed_words(self, action: Action, *, shown_version: int | None) -> str:
        order = action.order
        assert order is not None, "a refund always targets an order"
        changes = order_changes_since(order, shown_version) if shown_version is not None else []
        return (
            f"The order changed since you opened this page: "
            f"{'; '.join(changes or ['its details were changed'])}. "
            f"It now has {order.refundable_amount} {order.currency} left to refund."
        )

    def approval_refusal(self, action: Action) -> tuple[str, str] | None:
        order = action.order
        if order is not None and action.amount > order.refundable_amount:
            # Approving would only produce a STALE action at reservation: say so now.
            return (
                "over_refundable_balance",
                f"Order {order.number} has only {order.refundable_amount} {order.currency} left to refund.",
            )
        return None

    def target_balance(self, action: Action) -> tuple[str, Decimal] | None:
        assert action.order is not None, "a refund always targets an order"
        return (f"order {action.order.number}'s refundable balance", action.order.refundable_amount)

    def auto_approval_refusal(self, action: Action) -> str | None:
        order = action.order
        if order is None or action.amount > order.refundable_amount:
            return "the order no longer covers it"
        return None

    def reserve(self, action: Action, *, approved_version: int | None) -> list[BindingFailure]:
        """Reserve only if the order is still at the approved version and its balance covers it."""
        assert approved_version is not None, "a refund's approval binds the order's version"
        if sql.order_reserve(order_pk=_order_pk(action), version=approved_version, amount=action.amount):
            return []
        order = Order.objects.get(pk=_order_pk(action))
        if order.version != approved_version:
            return [
                BindingFailure(
                    "order_version",
                    f"The order changed since the approval (approved at version {approved_version}, "
                    f"now {order.version}).{outside_refunds_since(order, approved_version)}",
                )
            ]
        return [
            BindingFailure(
                "balance",
                f"The refundable balance {order.refundable_amount} {order.currency} no longer covers {action.amount}.",
            )
        ]

    def book_success(self, action: Action) -> None:
        """SUCCEEDED: the reserved amount becomes refunded money, in the same transaction."""
        sql.order_book(order_pk=_order_pk(action), amount=action.amount)

    def release(self, action: Action) -> None:
        """FAILED_FINAL: the reservation is released; the customer still expects their money."""
        sql.order_release(order_pk=_order_pk(action), amount=action.amount)

    def on_failure(self, action: Action) -> None:
        remedy_open(action)

    def failure_resolved(self, action: Action, *, owner: Any, choice: str, amount: Decimal, note: str) -> Remedy:
        """The customer still expects ``amount`` back: a remedy of the chosen kind, owned by ``owner``."""
        return Remedy.objects.create(
            action=action, kind=choice, amount=amount, currency=action.currency, owner=owner, note=note
        )

    def explained_effects(self) -> dict[str, str]:
        """Refunds at the provider that no action made but that are booked on their order as
        outside refunds: they are explained, not an effect without an action."""
        return {
            reference: f"an outside refund booked on order {number}"
            for reference, number in OutsideRefund.objects.filter(booked=True).values_list("reference", "order__number")
        }

    def money_violations(self) -> tuple[int, list[tuple[str, str]]]:
        """Per order: refunded = sum of SUCCEEDED refunds; reserved = sum over live ones (invariant 5);
        outside refunded = sum of the booked outside refunds; and all three within captured."""
        refunds = Action.objects.filter(kind=self.name)
        succeeded = dict(
            refunds.filter(status=S.SUCCEEDED).values_list("order_id").annotate(total=Sum("amount")).order_by()
        )
        reserved = dict(
            refunds.filter(status__in=RESERVING_STATUSES)
            .values_list("order_id")
            .annotate(total=Sum("amount"))
            .order_by()
        )
        outside = dict(
            OutsideRefund.objects.filter(booked=True).values_list("order_id").annotate(total=Sum("amount")).order_by()
        )
        orders = Order.objects.filter(
            Q(pk__in=succeeded.keys())
            | Q(pk__in=reserved.keys())
            | Q(pk__in=outside.keys())
            | ~Q(refunded_amount=0)
            | ~Q(reserved_amount=0)
            | ~Q(outside_refunded_amount=0)
        )
        problems: list[tuple[str, str]] = []
        count = 0
        for order in orders.iterator(chunk_size=2000):
            count += 1
            want_refunded = succeeded.get(order.pk) or Decimal("0")
            want_reserved = reserved.get(order.pk) or Decimal("0")
            subject = f"order-{order.number}"
            if order.refunded_amount != want_refunded:
                problems.append(
                    (subject, f"refunded {order.refunded_amount} but SUCCEEDED actions sum to {want_refunded}")
                )
            if order.reserved_amount != want_reserved:
                problems.append((subject, f"reserved {order.reserved_amount} but live actions sum to {want_reserved}"))
            want_outside = outside.get(order.pk) or Decimal("0")
            if order.outside_refunded_amount != want_outside:
                problems.append(
                    (
                        subject,
                        f"outside refunded {order.outside_refunded_amount} but booked outside refunds "
                        f"sum to {want_outside}",
                    )
                )
            if order.refunded_amount + order.reserved_amount + order.outside_refunded_amount > order.captured_amount:
                problems.append((subject, "refunded + reserved + refunded outside exceeds captured"))
        return count, problems


def _order_pk(action: Action) -> int:
    assert action.order_id is not None, "a refund always targets an order"
    return action.order_id


def remedy_open(action: Action) -> Remedy:
    return Remedy.objects.create(
        action=action,
        amount=action.amount,
        currency=action.currency,
        owner=owner_pick(kind=action.kind, default_group=RefundKind.owner_group),
        note="Opened automatically: the refund failed for good. Choose store credit, a manual transfer or a cheque.",
    )
