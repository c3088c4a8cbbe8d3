"""Orders, refund requests, suppliers, bills and adjustment requests."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import F
from django.http import HttpRequest

from actions.admin.base import CurrencyFilter, LargeTableAdmin, ReadOnlyAdmin, ReadOnlyInline
from actions.models import (
    AdjustmentRequest,
    Bill,
    Order,
    RefundRequest,
    Supplier,
    SupplierContact,
)

# --- orders and refund requests --------------------------------------------------------------


class RefundRequestInline(ReadOnlyInline):
    model = RefundRequest
    fields = ("number", "external_reference", "source", "created_at")
    readonly_fields = fields


@admin.register(Order)
class OrderAdmin(LargeTableAdmin):
    list_display = (
        "number",
        "customer_name",
        "currency",
        "captured_amount",
        "refunded_amount",
        "reserved_amount",
        "version",
        "paid_at",
    )
    list_filter = (CurrencyFilter,)
    # Substrings, served by the trigram indexes order_*_trgm_idx on PostgreSQL.
    search_fields = (
        "number__icontains",
        "customer_name__icontains",
        "customer_email__icontains",
        "charge_reference__icontains",
    )
    search_help_text = "Any part of an order number, customer name or email, or charge reference (ch_…)."
    inlines = [RefundRequestInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # In production orders come from the shop, each with a charge the provider holds. An
        # order typed in here would make money refundable that no customer paid, so typing
        # them in is for demos and development only (ADMIN_MAY_CREATE_ORDERS).
        return settings.ADMIN_MAY_CREATE_ORDERS and super().has_add_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # refunds and approvals point at it

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Money and version change only through the reservation and outcome services.
        computed = ("refunded_amount", "reserved_amount", "version", "created_at")
        if obj is None:
            return computed
        # The number and charge are inside action ids and payloads; the captured amount and
        # currency are what every refund was checked against.
        return ("number", "currency", "captured_amount", "charge_reference", "paid_at", *computed)


@admin.register(RefundRequest)
class RefundRequestAdmin(LargeTableAdmin):
    list_display = ("__str__", "order", "number", "external_reference", "source", "created_at")
    list_filter = ("source",)
    list_select_related = ("order",)
    search_fields = ("order__number__exact", "external_reference__icontains")
    search_help_text = "An exact order number, or any part of the external reference (ticket id)."
    raw_id_fields = ("order",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Once created, a request's identity is part of action ids: it cannot move. Which agent
        # opened it decides who may read it back over the API: never typed in.
        return ("order", "number", "opened_by_agent", "created_at") if obj else ("opened_by_agent", "created_at")



class SupplierContactInline(admin.TabularInline):
    model = SupplierContact
    extra = 1


@admin.register(Supplier)
class SupplierAdmin(admin.ModelAdmin):
    """Suppliers and the only addresses supplier emails may go to. Any change to the contacts
    raises the supplier's version: an email approved against the old list goes stale at its
    claim and asks the manager again."""

    list_display = ("code", "name", "version")
    search_fields = ("code", "name", "contacts__email")
    readonly_fields = ("version",)
    inlines = [SupplierContactInline]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        if change and any(formset.has_changed() for formset in formsets):
            Supplier.objects.filter(pk=form.instance.pk).update(version=F("version") + 1)


@admin.register(Bill)
class BillAdmin(ReadOnlyAdmin):
    """Supplier bills that invoice adjustments draw on. Read-only here: their money changes only
    through the reservation and outcome services, like an order's."""

    list_display = (
        "number",
        "supplier_name",
        "currency",
        "amount",
        "amount_due",
        "adjusted_amount",
        "reserved_amount",
        "version",
        "voided",
    )
    list_filter = (CurrencyFilter, "voided")
    search_fields = ("number__exact", "accounting_reference__exact", "purchase_order__exact")
    search_help_text = "An exact bill number, accounting reference or purchase order."


@admin.register(AdjustmentRequest)
class AdjustmentRequestAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "bill", "number", "external_reference", "created_at")
    list_select_related = ("bill",)
    search_fields = ("external_reference__exact",)
