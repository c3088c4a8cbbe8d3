"""Orders from the shop: created, or brought up to date, idempotently by the shop's order number.

The shop (its commerce system over ``POST /api/v1/orders``, or ``manage.py import_charges``
reading the payment provider's charges) is the authority on what an order is. The console is
the authority on what was refunded and what is reserved, so neither of those columns is ever
written here.

A change to an order raises its ``version``. An approval is bound to the version it was given
at (docs/architecture.md section 5), so the worker's reservation refuses it and the action goes STALE:
nobody's approval of a refund carries over to an order that has since changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from actions.kinds.fields import REFERENCE_PATTERN, FieldProblem, ProposalInvalid
from actions.models import Order
from actions.providers.money import currency_exponent

logger = logging.getLogger(__name__)

MAX_CUSTOMER_NAME_LENGTH = 200
MAX_CHARGE_REFERENCE_LENGTH = 255
# Whole-unit digits an order's amount may have: the column holds 14 digits, 2 of them decimals.
MAX_AMOUNT_DIGITS = 12

# A payment before this year or in the future is a mistake in the shop's data.
EARLIEST_PAYMENT_YEAR = 1990
PAYMENT_CLOCK_SKEW = timedelta(minutes=10)

# The fields the shop owns. Money the console moved (refunded, reserved) is not among them.
SHOP_FIELDS = ("customer_name", "customer_email", "currency", "captured_amount", "charge_reference", "paid_at")


@dataclass(frozen=True)
class OrderData:
    """An order as the shop describes it, checked."""

    number: str
    customer_name: str
    customer_email: str
    currency: str
    captured_amount: Decimal
    charge_reference: str
    paid_at: datetime


@dataclass(frozen=True)
class OrderResult:
    order: Order
    created: bool
    # Names of the shop's fields that changed (the version was raised once for all of them).
    changed: tuple[str, ...] = ()


class OrderConflict(Exception):
    """The change cannot be applied to the order as the console knows it. Nothing was written.

    ``field`` names the request field; ``code`` is machine-readable.
    """

    def __init__(self, *, order: Order, field: str, code: str, message: str) -> None:
        super().__init__(message)
        self.order = order
        self.field = field
        self.code = code
        self.message = message


class OrderBusy(Exception):
    """The order changed under every attempt to update it. Nothing was written; retry."""


def _text(raw: object) -> str:
    return str(raw if raw is not None else "").strip()


def _check_text(raw: object, name: str, limit: int, problems: list[FieldProblem], *, required: bool) -> str:
    value = _text(raw)
    if required and not value:
        problems.append(FieldProblem(name, "required", "This field is required."))
    elif len(value) > limit:
        problems.append(FieldProblem(name, "too_long", f"Use at most {limit} characters."))
    elif any(ord(char) < 32 or 0xD800 <= ord(char) <= 0xDFFF for char in value):
        problems.append(FieldProblem(name, "invalid_characters", "Control characters are not allowed."))
    return value


def _check_currency(raw: object, problems: list[FieldProblem]) -> str | None:
    value = _text(raw).upper()
    if value not in settings.CONSOLE_CURRENCIES:
        problems.append(
            FieldProblem(
                "currency",
                "unsupported_currency",
                f"Use one of the currencies the console accepts: {', '.join(settings.CONSOLE_CURRENCIES)}.",
            )
        )
        return None
    return value


def _check_amount(raw: object, currency: str | None, problems: list[FieldProblem]) -> Decimal | None:
    if isinstance(raw, float | bool):
        # A float cannot hold most decimal amounts exactly.
        problems.append(
            FieldProblem("captured_amount", "invalid_type", 'Give the amount as a decimal string, e.g. "79.00".')
        )
        return None
    try:
        amount = Decimal(str(raw).strip())
    except (InvalidOperation, ValueError):
        amount = Decimal("NaN")
    if not amount.is_finite() or amount <= 0:
        problems.append(
            FieldProblem("captured_amount", "invalid_amount", 'Give a positive decimal amount, e.g. "79.00".')
        )
        return None
    exponent = min(currency_exponent(currency), 2) if currency else 2
    if amount != amount.quantize(Decimal(1).scaleb(-exponent)) or amount >= Decimal(10) ** MAX_AMOUNT_DIGITS:
        problems.append(
            FieldProblem(
                "captured_amount",
                "invalid_amount",
                f"Use at most {exponent} decimal places for {currency or 'this currency'} and at most "
                f"{MAX_AMOUNT_DIGITS} digits before the point.",
            )
        )
        return None
    return amount


def order_data_check(
    *,
    number: object,
    customer_name: object,
    customer_email: object = "",
    currency: object,
    captured_amount: object,
    charge_reference: object = "",
    paid_at: object,
) -> OrderData:
    """Check an order's fields as the shop sent them. Raises ProposalInvalid naming each field."""
    problems: list[FieldProblem] = []
    order_number = _text(number)
    if not REFERENCE_PATTERN.match(order_number):
        # The number ends up in action ids and idempotency keys: the key's character set.
        problems.append(
            FieldProblem(
                "order_number",
                "invalid_reference",
                "Use 1 to 32 characters: letters, digits, '.', '_' or '-', starting with a letter or digit.",
            )
        )
    name = _check_text(customer_name, "customer_name", MAX_CUSTOMER_NAME_LENGTH, problems, required=True)
    email = _check_text(customer_email, "customer_email", 254, problems, required=False)
    if email:
        try:
            validate_email(email)
        except ValidationError:
            problems.append(FieldProblem("customer_email", "invalid_email", "This is not an email address."))
    code = _check_currency(currency, problems)
    amount = _check_amount(captured_amount, code, problems)
    charge = _check_text(charge_reference, "charge_reference", MAX_CHARGE_REFERENCE_LENGTH, problems, required=False)
    if not isinstance(paid_at, datetime) or paid_at.utcoffset() is None:
        problems.append(
            FieldProblem("paid_at", "invalid_datetime", "Give the time of payment with its offset, e.g. ...Z.")
        )
    # The year first: comparing an aware time in year 9999 with now can overflow on the offset.
    elif not EARLIEST_PAYMENT_YEAR <= paid_at.year < 9999 or paid_at > timezone.now() + PAYMENT_CLOCK_SKEW:
        problems.append(FieldProblem("paid_at", "out_of_range", "The time of payment cannot be in the future."))
    if problems:
        raise ProposalInvalid(problems)
    assert code is not None and amount is not None and isinstance(paid_at, datetime)
    return OrderData(
        number=order_number,
        customer_name=name,
        customer_email=email,
        currency=code,
        captured_amount=amount,
        charge_reference=charge,
        paid_at=paid_at,
    )


# Optional fields: left empty, they mean "not given", and what the order has is kept (the shop
# may not know the charge id that import_charges recorded, and must not be refused for it).
OPTIONAL_FIELDS = frozenset({"customer_email", "charge_reference"})


def _differences(order: Order, data: OrderData) -> dict[str, Any]:
    return {
        name: getattr(data, name)
        for name in SHOP_FIELDS
        if getattr(order, name) != getattr(data, name) and not (name in OPTIONAL_FIELDS and not getattr(data, name))
    }


def _refuse(order: Order, changes: dict[str, Any]) -> None:
    """Changes the console cannot apply, whatever the shop says."""
    if "currency" in changes:
        raise OrderConflict(
            order=order,
            field="currency",
            code="currency_changed",
            message=f"Order {order.number} is in {order.currency}; an order's currency never changes (every refund "
            "on it was decided in that currency). Nothing was written.",
        )
    if "charge_reference" in changes and order.charge_reference:
        raise OrderConflict(
            order=order,
            field="charge_reference",
            code="charge_changed",
            message=f"Order {order.number} was paid by charge {order.charge_reference}; refunds go to that charge, "
            "so it cannot be replaced. Nothing was written.",
        )
    captured = changes.get("captured_amount")
    taken = order.refunded_amount + order.reserved_amount + order.outside_refunded_amount
    if captured is not None and captured < taken:
        raise OrderConflict(
            order=order,
            field="captured_amount",
            code="captured_below_refunds",
            message=f"Order {order.number} has {order.refunded_amount} {order.currency} refunded and "
            f"{order.reserved_amount} {order.currency} reserved for refunds under way; the captured amount cannot "
            f"drop below their sum ({order.refunded_amount + order.reserved_amount}). Nothing was written.",
        )


def order_upsert(*, data: OrderData, source: str) -> OrderResult:
    """Create the order, return it unchanged, or apply the shop's changes and raise its version.

    - A new number: the order is created at version 1 (``created``).
    - The same fields again: nothing is written (a retry is always safe).
    - Changed fields: one conditional UPDATE writes them and raises the version, so that every
      approval bound to the old version goes stale at the worker's reservation. The UPDATE
      only applies at the version read and only while the captured amount still covers what
      is refunded and reserved; a reservation that slipped in between makes it read again.
    - A change the console cannot apply raises OrderConflict naming the field (see ``_refuse``).
    """
    for _ in range(5):
        order = Order.objects.filter(number=data.number).first()
        if order is None:
            try:
                # A savepoint-free durable transaction: a concurrent creator of the same number
                # loses on the UNIQUE constraint and goes round the loop to compare instead.
                with transaction.atomic(durable=True):
                    order = Order.objects.create(
                        number=data.number, **{name: getattr(data, name) for name in SHOP_FIELDS}
                    )
            except IntegrityError:
                continue
            logger.info("order %s created from %s", order.number, source)
            return OrderResult(order=order, created=True)
        changes = _differences(order, data)
        if not changes:
            return OrderResult(order=order, created=False)
        _refuse(order, changes)
        captured = changes.get("captured_amount", order.captured_amount)
        with transaction.atomic(durable=True):
            updated = Order.objects.filter(
                pk=order.pk,
                version=order.version,
                refunded_amount__lte=captured - F("reserved_amount") - F("outside_refunded_amount"),
            ).update(**changes, version=F("version") + 1)
        if updated:
            order.refresh_from_db()
            logger.info(
                "order %s changed by %s: %s; version now %s", order.number, source, ", ".join(changes), order.version
            )
            return OrderResult(order=order, created=False, changed=tuple(sorted(changes)))
        # Another writer (a reservation, an outcome, another upsert) changed the order since it
        # was read: read it again and decide against what is there now.
    raise OrderBusy(f"Order {data.number} kept changing while it was being updated; send the same request again.")
