"""Remedies, discrepancies (with the compensation of a duplicate), ledger audit runs and the
owner groups."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from actions.admin.base import AssignOwnerForm, CompensationForm, ReadOnlyAdmin, may_correct
from actions.kinds import kind_for
from actions.models import (
    Action,
    ActionKind,
    Discrepancy,
    DiscrepancyKind,
    LedgerAuditCursor,
    LedgerAuditRun,
    OwnerGroup,
    Remedy,
)
from actions.review.corrections import (
    CorrectionRefused,
    discrepancy_compensate,
    followup_owner_assign,
)

# --- follow-ups ------------------------------------------------------------------------------


class FollowUpAdmin(ReadOnlyAdmin):
    """Remedies and discrepancies: finance works them in the review queue, through its services
    (status flow, notes, audit events), so here they are read-only. An admin may reassign them."""

    actions = ["assign_owner"]
    max_assigned = 50

    def has_correct_permission(self, request: HttpRequest) -> bool:
        return may_correct(request)

    @admin.action(description="Assign an owner", permissions=["correct"])
    def assign_owner(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        chosen = list(queryset.select_related("action", "owner")[: self.max_assigned + 1])
        if len(chosen) > self.max_assigned:
            self.message_user(request, f"Choose at most {self.max_assigned} at a time.", messages.ERROR)
            return None
        form = AssignOwnerForm(request.POST if "confirm" in request.POST else None)
        if form.is_valid():
            for item in chosen:
                try:
                    followup_owner_assign(
                        model=self.model,
                        pk=item.pk,
                        owner=form.cleaned_data["owner"],
                        user=request.user,
                        reason=form.cleaned_data["reason"],
                    )
                except CorrectionRefused as refusal:
                    self.message_user(request, f"{item}: {refusal.message}", messages.ERROR)
            owner = form.cleaned_data["owner"].get_username()
            self.message_user(request, f"Assigned to {owner}; the notes and audit trail say why.", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Assign an owner to {self.opts.verbose_name_plural}",
            "items": chosen,
            "form": form,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "action_name": "assign_owner",
        }
        return TemplateResponse(request, "admin/actions/followup_assign_owner.html", context)


@admin.register(Remedy)
class RemedyAdmin(FollowUpAdmin):
    list_display = ("action", "kind", "status", "amount", "currency", "owner", "created_at")
    list_filter = ("status", "kind")
    list_select_related = ("action", "owner")
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    # The model's own order (the shared follow-up fields are declared first, on the base).
    fields = ("action", "kind", "status", "amount", "currency", "owner", "note")


@admin.register(Discrepancy)
class DiscrepancyAdmin(FollowUpAdmin):
    list_display = ("detected_at", "kind", "action", "provider_reference", "status", "owner", "compensating_action")
    list_filter = ("status", "kind")
    list_select_related = ("action", "owner")
    search_fields = ("provider_reference__icontains", "action__action_id__icontains")
    search_help_text = "Any part of a provider reference or action id."
    fields = (
        "kind",
        "action",
        "provider_reference",
        "details",
        "compensating_action_link",
        "status",
        "owner",
        "note",
        "detected_at",
        "updated_at",
    )
    readonly_fields = ("compensating_action_link",)
    actions = ["start_compensation", "assign_owner"]
    # One admin action may start at most this many compensations: each is a proposal a
    # manager must read.
    max_compensations = 20

    @admin.display(description="compensating action")
    def compensating_action(self, obj: Discrepancy) -> str:
        return str(obj.details.get("compensating_action") or "")

    @admin.display(description="compensating action")
    def compensating_action_link(self, obj: Discrepancy) -> str:
        action_id = obj.details.get("compensating_action")
        action = Action.objects.filter(action_id=action_id).first() if action_id else None
        if action is None:
            return "-"
        return format_html(
            '<a href="{}">{}</a> ({})',
            reverse("admin:actions_action_change", args=[action.pk]),
            action.action_id,
            action.get_status_display(),
        )

    @admin.action(description="Start a compensating action", permissions=["correct"])
    def start_compensation(self, request: HttpRequest, queryset: QuerySet[Discrepancy]) -> HttpResponse | None:
        chosen = list(queryset.select_related("action")[: self.max_compensations + 1])
        if len(chosen) > self.max_compensations:
            self.message_user(
                request, f"Choose at most {self.max_compensations} discrepancies at a time.", messages.ERROR
            )
            return None
        not_duplicates = [d for d in chosen if d.kind != DiscrepancyKind.DUPLICATE_EFFECT]
        if not_duplicates:
            self.message_user(
                request,
                "Only a duplicate effect is compensated. Not: "
                + ", ".join(f"#{d.pk} ({d.get_kind_display().lower()})" for d in not_duplicates),
                messages.ERROR,
            )
            return None
        form = CompensationForm(request.POST if "confirm" in request.POST else None)
        if form.is_valid():
            for discrepancy in chosen:
                try:
                    action = discrepancy_compensate(
                        discrepancy_pk=discrepancy.pk, user=request.user, note=form.cleaned_data["note"]
                    )
                except CorrectionRefused as refusal:
                    self.message_user(request, f"Discrepancy #{discrepancy.pk}: {refusal.message}", messages.ERROR)
                else:
                    followup = kind_for(action.kind).correction_followup
                    self.message_user(
                        request,
                        format_html(
                            'Discrepancy #{}: compensating action <a href="{}">{}</a> is proposed and waits for '
                            "a manager's approval. {}",
                            discrepancy.pk,
                            reverse("admin:actions_action_change", args=[action.pk]),
                            action.action_id,
                            followup,
                        ),
                        messages.SUCCESS,
                    )
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Start a compensating action",
            "discrepancies": chosen,
            "form": form,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "action_name": "start_compensation",
        }
        return TemplateResponse(request, "admin/actions/discrepancy/compensate.html", context)


@admin.register(LedgerAuditRun)
class LedgerAuditRunAdmin(ReadOnlyAdmin):
    list_display = (
        "started_at",
        "finished_at",
        "effects_seen",
        "actions_checked",
        "discrepancies_found",
        "discrepancies_new",
        "ok",
        "error",
    )

    @admin.display(boolean=True, description="clean")
    def ok(self, obj: LedgerAuditRun) -> bool:
        return obj.ok


@admin.register(LedgerAuditCursor)
class LedgerAuditCursorAdmin(ReadOnlyAdmin):
    """How far the audit has read each kind's receiver: the next run starts there."""

    list_display = ("kind", "audited_until", "updated_at")


class OwnerGroupForm(forms.ModelForm):
    kind = forms.ChoiceField(choices=ActionKind.choices)

    class Meta:
        model = OwnerGroup
        fields = ("kind", "group")


@admin.register(OwnerGroup)
class OwnerGroupAdmin(admin.ModelAdmin):
    form = OwnerGroupForm
    list_display = ("kind", "group")
    list_select_related = ("group",)
