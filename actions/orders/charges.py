"""Orders from the payment provider's charges: ``manage.py import_charges``.

Charges are read with Stripe's list API, a page at a time (``limit`` and ``starting_after``,
until ``has_more`` is false), and each becomes an order through ``actions.orders.services``, the same
service the orders API uses. The import is idempotent: a second run changes nothing unless the
provider's charge changed.

What a charge decides and what it does not:
- It names its order through its metadata (``CHARGE_ORDER_NUMBER_METADATA_KEY``, by default
  ``order_number``); a charge without one is skipped and reported, never given an invented
  number agents could not know.
- It is the authority on the captured amount, the currency and the charge reference.
- The customer's name and email and the time of payment come from the charge only when the
  order is created; afterwards the shop's own values (``POST /api/v1/orders``) are kept, so
  that an import never raises an order's version for a difference the shop does not care about.
- Refunds on the charge are not booked here: those made through the console are booked by its
  workers, and those made outside it are the webhook's business.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import stripe
from django.conf import settings

from actions.kinds.fields import ProposalInvalid
from actions.models import Order
from actions.orders.services import OrderBusy, OrderConflict, order_data_check, order_upsert
from actions.providers.money import from_minor_units

logger = logging.getLogger(__name__)

SOURCE = "import_charges"


class ChargeListFailed(Exception):
    """The provider did not answer a page of the list. Orders already imported stay; run again."""


@dataclass
class ImportReport:
    pages: int = 0
    charges: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    # (charge id, why) for each charge that did not become an order.
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.charges} charges on {self.pages} pages: {self.created} orders created, {self.updated} updated, "
            f"{self.unchanged} unchanged, {len(self.skipped)} skipped"
        )


def provider_client() -> stripe.StripeClient:
    """A Stripe client for the configured provider (the sandbox in development and tests)."""
    return stripe.StripeClient(
        settings.PROVIDER_API_KEY,
        base_addresses={"api": settings.PROVIDER_API_BASE.rstrip("/")},
        # A failed page is reported and the command run again: the import is idempotent.
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=settings.PROVIDER_TIMEOUT_SECONDS),
    )


def charges_list_pages(*, client: stripe.StripeClient, page_size: int = 100) -> Iterator[list[dict[str, Any]]]:
    """Every charge, newest first, one page (a list of Stripe's charge objects) at a time."""
    if not 1 <= page_size <= 100:
        raise ValueError("page_size must be between 1 and 100 (Stripe's limit)")
    starting_after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": page_size}
        if starting_after is not None:
            params["starting_after"] = starting_after
        try:
            page = client.v1.charges.list(params=params)  # type: ignore[arg-type]
        except stripe.StripeError as exc:
            raise ChargeListFailed(f"The provider did not list charges after {starting_after}: {exc}") from exc
        response = page.last_response
        body: dict[str, Any] = response.data if response is not None and isinstance(response.data, dict) else {}
        body = body or page.to_dict()
        data = body.get("data")
        if not isinstance(data, list):
            raise ChargeListFailed("The provider answered a charge list without data.")
        yield data
        if not body.get("has_more") or not data:
            return
        starting_after = str(data[-1]["id"])


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def charge_import(*, charge: Mapping[str, Any], report: ImportReport) -> Order | None:
    """Create or update the order one charge names. Problems are added to ``report``."""
    charge_id = str(charge.get("id", ""))
    metadata = charge.get("metadata") if isinstance(charge.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    if charge.get("status") != "succeeded" or charge.get("captured") is False:
        report.skipped.append((charge_id, f"not a captured payment (status {charge.get('status')!r})"))
        return None
    number = _text(metadata.get(settings.CHARGE_ORDER_NUMBER_METADATA_KEY))
    if not number:
        report.skipped.append((charge_id, f"no order number in metadata[{settings.CHARGE_ORDER_NUMBER_METADATA_KEY}]"))
        return None
    currency = _text(charge.get("currency")).upper()
    captured = charge.get("amount_captured", charge.get("amount"))
    existing = Order.objects.filter(number=number).first()
    billing = charge.get("billing_details") if isinstance(charge.get("billing_details"), Mapping) else {}
    assert isinstance(billing, Mapping)
    paid_at: datetime | None
    if existing is not None:
        name, email, paid_at = existing.customer_name, existing.customer_email, existing.paid_at
    else:
        name = _text(billing.get("name")) or _text(metadata.get("customer_name")) or f"Customer of {charge_id}"
        email = _text(billing.get("email")) or _text(charge.get("receipt_email"))
        created = charge.get("created")
        paid_at = datetime.fromtimestamp(created, tz=UTC) if isinstance(created, int) else None
    try:
        data = order_data_check(
            number=number,
            customer_name=name,
            customer_email=email,
            currency=currency,
            captured_amount=from_minor_units(captured, currency) if isinstance(captured, int) and currency else None,
            charge_reference=charge_id,
            paid_at=paid_at,
        )
        result = order_upsert(data=data, source=SOURCE)
    except ProposalInvalid as invalid:
        report.skipped.append((charge_id, f"order {number}: {invalid}"))
        return None
    except (OrderConflict, OrderBusy) as refused:
        report.skipped.append((charge_id, f"order {number}: {refused}"))
        return None
    if result.created:
        report.created += 1
    elif result.changed:
        report.updated += 1
    else:
        report.unchanged += 1
    return result.order


def charges_import(
    *, client: stripe.StripeClient | None = None, page_size: int = 100, max_charges: int | None = None
) -> ImportReport:
    """Read the provider's charges, newest first, and create or update their orders.

    Each order is written in its own transaction and no transaction is open while a page is
    read from the provider: an interrupted run keeps what it imported, and the next run
    finds those orders unchanged.
    """
    client = client or provider_client()
    report = ImportReport()
    for page in charges_list_pages(client=client, page_size=page_size):
        report.pages += 1
        for charge in page:
            if max_charges is not None and report.charges >= max_charges:
                return report
            report.charges += 1
            charge_import(charge=charge, report=report)
    logger.info("import_charges: %s", report.summary())
    return report
