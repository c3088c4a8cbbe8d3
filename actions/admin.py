"""The admin site: for corrections, not for rewriting history.

Material fields and the audit trail are read-only here. State changes go through services
(see issue 6 for the FSM admin integration); nothing in this file changes an action's status.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from actions.models import (
    Action,
    ActionEvent,
    Agent,
    AgentToken,
    Attempt,
    Discrepancy,
    Order,
    OwnerGroup,
    RefundRequest,
    Remedy,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that are history: visible, never edited or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RefundRequestInline(admin.TabularInline):
    model = RefundRequest
    extra = 0
    fields = ("number", "external_reference", "source", "created_at")
    readonly_fields = ("created_at",)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
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
    list_filter = ("currency",)
    search_fields = ("number", "customer_name", "customer_email", "charge_reference")
    # Money and version change only through the reservation and outcome services.
    readonly_fields = ("refunded_amount", "reserved_amount", "version", "created_at")
    inlines = [RefundRequestInline]
    date_hierarchy = "paid_at"
    show_full_result_count = False


@admin.register(RefundRequest)
class RefundRequestAdmin(admin.ModelAdmin):
    list_display = ("__str__", "order", "number", "external_reference", "source", "created_at")
    list_filter = ("source",)
    search_fields = ("order__number", "external_reference")
    raw_id_fields = ("order",)
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Once created, a request's identity is part of action ids: it cannot move.
        return ("order", "number", "created_at") if obj else ("created_at",)


class ActionEventInline(admin.TabularInline):
    model = ActionEvent
    extra = 0
    can_delete = False
    fields = ("created_at", "transition", "from_state", "to_state", "actor_label", "reason")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ("started_at", "kind", "outcome", "held_lease", "response", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Action)
class ActionAdmin(admin.ModelAdmin):
    list_display = ("action_id", "kind", "status", "amount", "currency", "owner", "created_at")
    list_filter = ("status", "kind", "currency")
    search_fields = ("action_id", "provider_reference", "order__number")
    raw_id_fields = ("owner",)
    readonly_fields = (
        *Action.MATERIAL_FIELDS[:4],
        "order",
        "refund_request",
        "amount",
        "currency",
        "reason_code",
        "evidence",
        "proposed_by_agent",
        "proposed_by_user",
        "status",
        "rejection_reasons",
        "lease_token",
        "lease_expires_at",
        "attempt_count",
        "first_attempt_at",
        "last_attempt_at",
        "reconcile_attempts",
        "reconcile_failures",
        "next_reconcile_at",
        "provider_reference",
        "created_at",
        "updated_at",
        "status_changed_at",
        "due_at",
    )
    inlines = [ActionEventInline, AttemptInline]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # actions are proposed through the intent log, never typed in

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ActionEvent)
class ActionEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "action", "transition", "from_state", "to_state", "actor_label")
    list_filter = ("transition", "to_state", "actor_kind")
    search_fields = ("action__action_id", "actor_label")
    list_select_related = ("action",)
    show_full_result_count = False


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "action", "kind", "outcome", "held_lease")
    list_filter = ("kind", "outcome")
    search_fields = ("action__action_id", "idempotency_key")
    list_select_related = ("action",)
    show_full_result_count = False


@admin.register(Remedy)
class RemedyAdmin(admin.ModelAdmin):
    list_display = ("action", "kind", "status", "amount", "currency", "owner", "created_at")
    list_filter = ("status", "kind")
    search_fields = ("action__action_id",)
    readonly_fields = ("action", "amount", "currency", "created_at", "updated_at")
    show_full_result_count = False


@admin.register(Discrepancy)
class DiscrepancyAdmin(admin.ModelAdmin):
    list_display = ("detected_at", "kind", "action", "provider_reference", "status", "owner")
    list_filter = ("status", "kind")
    search_fields = ("provider_reference", "action__action_id")
    readonly_fields = ("kind", "action", "provider_reference", "details", "detected_at", "updated_at")
    show_full_result_count = False


@admin.register(OwnerGroup)
class OwnerGroupAdmin(admin.ModelAdmin):
    list_display = ("kind", "group")


class AgentTokenInline(admin.TabularInline):
    model = AgentToken
    extra = 0
    fields = ("label", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # tokens are created by a service that shows the secret once


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "scopes", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name", "owner__username")
    inlines = [AgentTokenInline]
