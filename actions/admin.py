"""The admin site: for corrections, not for rewriting history.

- Material fields and the audit trail are read-only (invariants 4 and 9). An action's change
  form saves nothing: every change to an action goes through a service that writes its audit
  event in the same transaction.
- State changes use django-fsm-2's FSMAdminMixin, but only for transitions that carry a
  permission, that the person holds, and that have a service here (cancel, reopen). The
  mixin's hook that performs the transition is replaced by a call to that service. Worker
  transitions (begin_submission, record_*, mark_unknown, escalate...) have no permission and
  are never offered.
- Only admins correct (invariant 10): the correction views and actions need
  ``actions.correct_action``, whatever other permissions a person holds.
- Remedies and discrepancies are worked by finance in the review queue, whose services keep
  their status flow and trail; here they are read-only, except an admin's reassignment and the
  compensating action for a duplicate effect (``actions.review.corrections``).
- Big tables never run an exact COUNT(*) (see ``EstimatedCountPaginator``), nor list filter
  choices with a SELECT DISTINCT over the whole table (see ``FixedChoicesFilter``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import cached_property
from typing import Any, cast

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Count, F, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django_fsm import ConcurrentTransition, Transition, TransitionNotAllowed
from django_fsm.admin import FSMAdminMixin, FSMObjectTransition

from actions.agents.services import (
    ORDERS_SCOPE,
    OWNER_CHANGE_BLOCKING_STATUSES,
    AgentChangeRefused,
    agent_owner_change,
    agent_owner_refusal,
    agent_token_revoke_by,
)
from actions.foundation.text import validate_plain_text
from actions.kinds import DuplicateCorrection, kind_for
from actions.kinds.base import Outcome
from actions.models import (
    Action,
    ActionEvent,
    ActionKind,
    ActionStatus,
    AdjustmentRequest,
    Agent,
    AgentToken,
    Attempt,
    Bill,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    FollowUpStatus,
    LedgerAuditRun,
    Order,
    OwnerGroup,
    RefundRequest,
    Remedy,
    SecurityEvent,
    Supplier,
    SupplierContact,
)
from actions.models.actions import UNRESOLVED_STATUSES
from actions.review.corrections import (
    CORRECT_PERMISSION,
    CorrectionRefused,
    action_owner_assign,
    adjustment_duplicates,
    adjustment_void_duplicate,
    discrepancy_compensate,
    followup_owner_assign,
    owner_candidates,
)
from actions.search import MIN_TERM_LENGTH, action_number, search_actions
from actions.services import ActionRefused, Actor, action_cancel
from approvals.services import DecisionRefused, action_reopen

# --- big tables ----------------------------------------------------------------------------


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts a big table exactly.

    An exact COUNT(*) reads every row (PostgreSQL keeps no row count), so a change list over
    millions of actions or events would take seconds before showing its first fifty rows.
    Instead:

    - with no filter and no search, a big table's size is PostgreSQL's own estimate
      (``pg_class.reltuples``, kept by autovacuum's ANALYZE), and the page says "about";
    - otherwise at most ``count_cap`` + 1 matching rows are counted; past that the page says
      "more than" and offers the first ``count_cap`` rows: filters and search narrow it down.
    """

    count_cap = 10_000
    # What kind of number ``count`` is: "exact", "estimate" or "at_least". Read by the
    # pagination template.
    count_kind = "exact"

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if not isinstance(object_list, QuerySet):
            return len(object_list)
        if not object_list.query.where:
            estimate = self._estimated_rows(object_list)
            if estimate is not None and estimate > self.count_cap:
                self.count_kind = "estimate"
                return estimate
        # Counting a sliced queryset counts inside a LIMIT subquery: it stops at the cap.
        counted = object_list.order_by()[: self.count_cap + 1].count()
        if counted > self.count_cap:
            self.count_kind = "at_least"
            return self.count_cap
        return counted

    @staticmethod
    def _estimated_rows(queryset: QuerySet[Any]) -> int | None:
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return None
        table = connection.ops.quote_name(queryset.model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
            row = cursor.fetchone()
        # -1 means never analyzed (PostgreSQL 14+): no estimate.
        if row is None or row[0] is None or row[0] < 0:
            return None
        return int(row[0])


class LargeTableAdmin(admin.ModelAdmin):
    """Change lists for tables that grow without bound."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts are one COUNT per filter choice over the whole table.
    show_facets = admin.ShowFacets.NEVER
    # The primary key's index serves the newest-first order with or without a filter; the
    # models' own orderings (created_at...) have no index of their own.
    ordering = ("-pk",)
    list_per_page = 50


class ReadOnlyAdmin(LargeTableAdmin):
    """Rows that are history: visible, never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class FixedChoicesFilter(admin.SimpleListFilter):
    """A filter on a plain column whose values are known in advance.

    Django's default filter for such a column lists its values with a SELECT DISTINCT over the
    whole table on every page view: seconds on a big table.
    """

    field_name = ""

    def choices_for(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return self.choices_for()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(**{self.field_name: self.value()})
        return queryset


class CurrencyFilter(FixedChoicesFilter):
    title = "currency"
    parameter_name = field_name = "currency"

    def choices_for(self) -> list[tuple[str, str]]:
        return [(code, code) for code in settings.CONSOLE_CURRENCIES]


class TransitionFilter(FixedChoicesFilter):
    title = "transition"
    parameter_name = field_name = "transition"

    def choices_for(self) -> list[tuple[str, str]]:
        status = Action._meta.get_field("status")
        names = {transition.name for transition in status.get_all_transitions(Action)}  # type: ignore[attr-defined]
        # The events of corrections and of finance's follow-ups, which leave the status as it is.
        names.add("assign_owner")
        # Events that leave the status as it is: an agent's owner changed, a cap held a proposal.
        names.update({"agent_owner_changed", "auto_approval_held"})
        for model, statuses in (("remedy", FollowUpStatus.values), ("discrepancy", DiscrepancyStatus.values)):
            names.add(f"{model}_assign_owner")
            names.update(f"{model}_{value}" for value in statuses)
        return [(name, name) for name in sorted(names)]


class OutcomeFilter(FixedChoicesFilter):
    title = "outcome"
    parameter_name = field_name = "outcome"

    def choices_for(self) -> list[tuple[str, str]]:
        return [(outcome.value, outcome.value) for outcome in Outcome]


def may_correct(request: HttpRequest) -> bool:
    return bool(request.user.is_active and request.user.has_perm(CORRECT_PERMISSION))


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


# --- actions -------------------------------------------------------------------------------


class ActionEventInline(ReadOnlyInline):
    model = ActionEvent
    fields = ("created_at", "transition", "from_state", "to_state", "actor_label", "reason")
    readonly_fields = fields


class AttemptInline(ReadOnlyInline):
    model = Attempt
    fields = ("started_at", "kind", "outcome", "held_lease", "response", "error")
    readonly_fields = fields


class CorrectionReasonForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        validators=[validate_plain_text],
        help_text="Why: this goes into the action's audit trail.",
    )


class AssignOwnerForm(forms.Form):
    owner = forms.ModelChoiceField(
        queryset=owner_candidates().none(),
        help_text="The person who works it from now on: someone with the finance role.",
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        validators=[validate_plain_text],
        help_text="Why: this goes into the action's audit trail.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Fresh per form: roles change while the process runs.
        self.fields["owner"].queryset = owner_candidates()  # type: ignore[attr-defined]


def _cancel(*, action_pk: int, user: Any, reason: str) -> None:
    action_cancel(action_pk=action_pk, actor=Actor.for_user(user), reason=reason)


def _reopen(*, action_pk: int, user: Any, reason: str) -> None:
    # Imported here: approvals builds on actions, not the other way round.

    action_reopen(action_pk=action_pk, user=user, note=reason)


@admin.register(Action)
class ActionAdmin(FSMAdminMixin, LargeTableAdmin):
    list_display = ("action_id", "kind", "status", "amount", "currency", "owner", "created_at")
    list_filter = ("status", "kind", CurrencyFilter)
    list_select_related = ("owner",)
    search_help_text = (
        "Any part of an action id, provider reference (re_…), order number, customer name or email, "
        "ticket, bill number or supplier."
    )
    # A search field is needed for the search box; get_search_results decides what it matches.
    search_fields = ("action_id",)
    fieldsets = (
        (
            "The business action (never changes after the proposal)",
            {
                "fields": (
                    "action_id",
                    "kind",
                    "idempotency_key",
                    "payload",
                    "payload_hash",
                    ("order", "refund_request"),
                    ("amount", "currency"),
                    "reason_code",
                    "evidence",
                    ("proposed_by_agent", "proposed_by_user"),
                )
            },
        ),
        ("State", {"fields": ("status", "status_changed_at", "rejection_reasons", ("owner", "due_at"))}),
        (
            "Execution",
            {
                "fields": (
                    ("lease_token", "lease_expires_at"),
                    ("attempt_count", "first_attempt_at", "last_attempt_at"),
                    ("reconcile_attempts", "reconcile_failures", "next_reconcile_at"),
                    "provider_reference",
                    ("created_at", "updated_at"),
                )
            },
        ),
    )
    # Every field, including any added later: nothing on an action is edited by a form.
    readonly_fields = tuple(field.name for field in Action._meta.concrete_fields if not field.primary_key)
    inlines = [ActionEventInline, AttemptInline]
    change_form_template = "admin/actions/action/change_form.html"

    fsm_fields = ["status"]
    # The transitions the admin offers, each with the service that performs it. A transition
    # is offered only if it is here, carries a permission= and the person holds it.
    fsm_services: dict[str, Callable[..., None]] = {"cancel": _cancel, "reopen": _reopen}
    fsm_forms = {"cancel": CorrectionReasonForm, "reopen": CorrectionReasonForm}
    fsm_labels = {"cancel": "Cancel the action", "reopen": "Ask for a new decision"}
    fsm_help_texts = {
        "cancel": "Before any reservation: the action will never be submitted.",
        "reopen": "The approval went stale; a manager decides again on the same, unchanged action.",
    }

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # actions are proposed through the intent log, never typed in

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # "Change" here means using the corrections, which are the admin's alone (invariant 10).
        return may_correct(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Action], search_term: str
    ) -> tuple[QuerySet[Action], bool]:
        # The console's search (actions/search.py): any part of an action id, a provider
        # reference, an order number, a customer's name or email, a ticket or a bill, each served
        # by a trigram index on PostgreSQL. Orders, tickets and bills are looked up first: a join
        # or an IN (subquery) inside the OR would make it read the whole table instead.
        term = " ".join(search_term.split())
        if not term:
            return queryset, False
        if len(term) < MIN_TERM_LENGTH:
            # Too short for the substring indexes: an exact action id or number only.
            number = action_number(term)  # None for "²", which isdigit() accepts and int() refuses
            exact = Q(action_id=term) | (Q(pk=number) if number is not None else Q())
            return queryset.filter(exact), False
        return search_actions(term, queryset), False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # Every field is read-only: a POST of the change form has nothing to save, and saving
        # the row anyway would only rewrite it outside any service.
        return None

    # -- the change page -----------------------------------------------------------------

    def _action(self, request: HttpRequest, object_id: str) -> Action | None:
        return cast(Action | None, self.get_object(request, object_id))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self._action(request, object_id)
        context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            "show_delete": False,
            "can_assign_owner": obj is not None and may_correct(request) and obj.status in UNRESOLVED_STATUSES,
            "can_void_credit_note": obj is not None and self._may_void_credit_note(request, obj),
        }
        if obj is not None:
            # Not "Change action": every field is read-only; the page shows one action and the
            # corrections that may be made to it.
            context["title"] = f"Action {obj.action_id} · {obj.get_status_display()}"
            context["subtitle"] = None  # the title already names the action
            # A list of its own: the mixin's transitions are a generator, used up by the object tools.
            context["corrections"] = [
                transition
                for block in self._get_fsm_extra_context(request=request, obj=obj)
                for transition in block.available_transitions
            ]
        return super().change_view(request, object_id, form_url=form_url, extra_context=context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/assign-owner/",
                self.admin_site.admin_view(self.assign_owner_view),
                name="actions_action_assign_owner",
            ),
            path(
                "<path:object_id>/void-credit-note/",
                self.admin_site.admin_view(self.void_credit_note_view),
                name="actions_action_void_credit_note",
            ),
            *super().get_urls(),
        ]

    # -- the FSM integration ---------------------------------------------------------------

    def is_fsm_transition_visible(self, transition: Transition) -> bool:
        return transition.name in self.fsm_services and transition.permission is not None

    def get_fsm_label(self, transition: Transition) -> str:
        return self.fsm_labels.get(transition.name, transition.name)

    def get_help_text(self, transition: Transition) -> str | None:
        return self.fsm_help_texts.get(transition.name)

    def _get_fsm_extra_context(self, *, request: HttpRequest, obj: Any) -> Generator[FSMObjectTransition]:
        if obj is not None and self.has_change_permission(request, obj):
            yield from super()._get_fsm_extra_context(request=request, obj=obj)

    def offered_transitions(self, request: HttpRequest, obj: Any) -> set[str]:
        """The transitions this person may run on this action now, through the admin."""
        return {
            transition.name
            for block in self._get_fsm_extra_context(request=request, obj=obj)
            for transition in block.available_transitions
        }

    def fsm_transition_view(
        self, request: HttpRequest, object_id: str, transition_name: str, **kwargs: Any
    ) -> HttpResponse:
        if transition_name not in self.fsm_services:
            raise Http404("This transition is not offered in the admin.")
        obj = self._action(request, object_id)
        if obj is not None and not self.has_change_permission(request, obj):
            raise PermissionDenied
        if obj is not None and transition_name not in self.offered_transitions(request, obj):
            self.message_user(
                request,
                f"{obj.action_id} is {obj.get_status_display().lower()}: "
                f"“{self.fsm_labels[transition_name]}” is not possible now, or not yours to do.",
                level=messages.ERROR,
            )
            return redirect("admin:actions_action_change", object_id=obj.pk)
        return super().fsm_transition_view(request, object_id, transition_name, **kwargs)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        transition_name = request.POST.get(self.fsm_post_param)
        if not transition_name:
            # save_model saved nothing: say so rather than "changed successfully".
            self.message_user(
                request,
                "Nothing on an action is edited in a form. Use the corrections at the top of the page.",
                messages.WARNING,
            )
            return HttpResponseRedirect(request.path)
        if transition_name not in self.fsm_services:
            self.message_user(
                request, self.fsm_transition_not_allowed_msg.format(transition_name=transition_name), messages.ERROR
            )
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def _apply_fsm_transition(
        self,
        *,
        obj: Any,
        transition_name: str,
        request: HttpRequest,
        kwargs: Any = None,
    ) -> bool:
        """Run the transition through its service, which writes the audit event.

        Replaces the mixin's hook, which calls the model method and saves the row: that would
        change the status with no audit event and no check of the action's own rules.
        """
        service = self.fsm_services.get(transition_name)
        if service is None or transition_name not in self.offered_transitions(request, obj):
            self.message_user(
                request, self.fsm_transition_not_allowed_msg.format(transition_name=transition_name), messages.ERROR
            )
            return False

        reason = str((kwargs or {}).get("reason", ""))
        try:
            service(action_pk=obj.pk, user=request.user, reason=reason)
        except (
            ActionRefused,
            DecisionRefused,
            CorrectionRefused,
            ConcurrentTransition,
            TransitionNotAllowed,
        ) as error:
            self.message_user(request, str(error), messages.ERROR)
            return False
        self.message_user(
            request,
            f"{obj.action_id}: {self.fsm_labels[transition_name].lower()}: done, and recorded in its audit trail.",
            messages.SUCCESS,
        )
        return True

    # -- assigning an owner -----------------------------------------------------------------

    def assign_owner_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        obj = self._action(request, object_id)
        if obj is None:
            raise Http404("No such action.")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        form = AssignOwnerForm(request.POST or None, initial={"owner": obj.owner_id})
        if request.method == "POST" and form.is_valid():
            try:
                action_owner_assign(
                    action_pk=obj.pk,
                    owner=form.cleaned_data["owner"],
                    user=request.user,
                    reason=form.cleaned_data["reason"],
                )
            except CorrectionRefused as refusal:
                self.message_user(request, refusal.message, messages.ERROR)
            else:
                self.message_user(
                    request,
                    f"{obj.action_id} is now owned by {form.cleaned_data['owner'].get_username()}; "
                    "the audit trail records who and why.",
                    messages.SUCCESS,
                )
                return redirect("admin:actions_action_change", object_id=obj.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": obj,
            "form": form,
            "title": f"Assign an owner to {obj.action_id}",
        }
        return TemplateResponse(request, "admin/actions/action/assign_owner.html", context)

    # -- voiding a duplicate credit note (invoice adjustments) --------------------------------

    @staticmethod
    def _may_void_credit_note(request: HttpRequest, obj: Action) -> bool:
        voided_by_correction = kind_for(obj.kind).duplicate_correction == DuplicateCorrection.VOID
        return voided_by_correction and obj.status == ActionStatus.SUCCEEDED and may_correct(request)

    def void_credit_note_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """A SUCCEEDED invoice adjustment's correction: propose voiding the second credit note the
        ledger audit found. The page shows which credit note is the adjustment (kept) and which
        are duplicates (the first is voided); the service refuses when there is none."""
        obj = self._action(request, object_id)
        if obj is None:
            raise Http404("No such action.")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        form = CompensationForm(request.POST or None)
        form.fields["note"].help_text = "Why the credit note is voided: goes into the audit trail and to the manager."
        if request.method == "POST" and form.is_valid():
            try:
                void = adjustment_void_duplicate(action_pk=obj.pk, user=request.user, note=form.cleaned_data["note"])
            except CorrectionRefused as refusal:
                self.message_user(request, refusal.message, messages.ERROR)
            else:
                self.message_user(
                    request,
                    format_html(
                        'Void <a href="{}">{}</a> is proposed and waits for a manager\'s approval; the engine '
                        "then voids the duplicate credit note. {} and its trail are unchanged.",
                        reverse("admin:actions_action_change", args=[void.pk]),
                        void.action_id,
                        obj.action_id,
                    ),
                    messages.SUCCESS,
                )
                return redirect("admin:actions_action_change", object_id=obj.pk)
        voids_duplicates = kind_for(obj.kind).duplicate_correction == DuplicateCorrection.VOID
        findings = adjustment_duplicates(obj) if voids_duplicates else []
        duplicates = sorted(
            {
                str(reference)
                for finding in findings
                for reference in finding.details.get("effects", [])
                if str(reference) != obj.provider_reference
            }
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": obj,
            "form": form,
            "findings": findings,
            "duplicates": duplicates,
            "voids": [f.details.get("compensating_action") for f in findings if f.details.get("compensating_action")],
            "title": f"Void a duplicate credit note of {obj.action_id}",
        }
        return TemplateResponse(request, "admin/actions/action/void_credit_note.html", context)


@admin.register(ActionEvent)
class ActionEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "action", "transition", "from_state", "to_state", "actor_label")
    list_filter = (TransitionFilter, "actor_kind")
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    list_select_related = ("action",)
    # created_at has its own index; newest first.
    ordering = ("-created_at",)


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "action", "kind", "outcome", "held_lease")
    list_filter = ("kind", OutcomeFilter)
    search_fields = ("action__action_id__exact",)
    search_help_text = "An exact action id."
    list_select_related = ("action",)


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


class CompensationForm(forms.Form):
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        validators=[validate_plain_text],
        help_text="Why, and how finance should recover the money: goes into the audit trail and to the manager.",
    )


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


# --- agents and their tokens -----------------------------------------------------------------

# Agents propose refunds, or send the shop's orders; a compensation is only ever started by an
# admin's correction.
AGENT_SCOPES = [
    (ActionKind.REFUND.value, ActionKind.REFUND.label),
    (ORDERS_SCOPE, "Orders (send the shop's orders)"),
    (ActionKind.SUPPLIER_EMAIL.value, "Supplier emails (from the console's templates)"),
]


class AgentForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=AGENT_SCOPES,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="The action kinds it may propose, and whether it may send the shop's orders.",
    )
    owner_change_reason = forms.CharField(
        required=False,
        max_length=2000,
        validators=[validate_plain_text],
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="When changing the owner: why. It goes into the security trail and the agent's open actions' trails.",
    )

    class Meta:
        model = Agent
        fields = ("name", "owner", "scopes", "is_active")

    def clean_owner(self) -> Any:
        owner = self.cleaned_data.get("owner")
        refusal = agent_owner_refusal(owner)
        if refusal:
            raise forms.ValidationError(refusal)
        if self.instance.pk is not None and owner is not None and owner.pk != self.instance.owner_id:
            live = Action.objects.filter(proposed_by_agent=self.instance, status__in=OWNER_CHANGE_BLOCKING_STATUSES)
            if live.exists():
                raise forms.ValidationError(
                    "This agent has actions awaiting a decision or approved and not yet sent: its owner cannot "
                    "change until they are decided and sent, or cancelled (four eyes are bound to the owner)."
                )
        return owner

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is not None and "owner" in self.changed_data and not cleaned.get("owner_change_reason"):
            self.add_error("owner_change_reason", "Say why the owner changes: it goes into the trails.")
        return cleaned


class AgentTokenInline(ReadOnlyInline):
    model = AgentToken
    # The hash is not shown: it identifies nothing a person needs, and the prefix does.
    fields = ("prefix", "label", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """Agents are created, switched off and given to a new owner here. Their tokens are not
    issued here: only the agent's owner issues them, on the owner page in the console, so that
    an admin can never hold a token that proposes refunds in another person's name."""

    form = AgentForm
    list_display = ("name", "owner", "scopes", "is_active", "active_tokens", "created_at")
    list_filter = ("is_active",)
    list_select_related = ("owner",)
    search_fields = ("name", "owner__username")
    raw_id_fields = ("owner",)
    inlines = [AgentTokenInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Agent]:
        return (
            super()
            .get_queryset(request)
            .annotate(active_token_count=Count("tokens", filter=Q(tokens__revoked_at__isnull=True)))
        )

    @admin.display(description="active tokens", ordering="active_token_count")
    def active_tokens(self, obj: Any) -> int:
        return int(obj.active_token_count)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # switch it off instead: its proposals name it

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change or "owner" not in form.changed_data:
            super().save_model(request, obj, form, change)
            return
        # The owner changes through its service: it re-checks the agent's live actions under a
        # row lock, revokes the previous owner's tokens and writes the trails.
        new_owner = obj.owner
        obj.owner = Agent.objects.get(pk=obj.pk).owner
        obj.save()
        try:
            agent_owner_change(
                agent=obj, owner=new_owner, user=request.user, reason=form.cleaned_data.get("owner_change_reason", "")
            )
        except AgentChangeRefused as refused:
            self.message_user(request, refused.message, messages.ERROR)
        else:
            self.message_user(
                request,
                f"{obj.name} now belongs to {new_owner.get_username()}. Its tokens were revoked: the new owner "
                "issues new ones on the owner page.",
                messages.WARNING,
            )
        obj.refresh_from_db()


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "Active"), ("revoked", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(AgentToken)
class AgentTokenAdmin(LargeTableAdmin):
    list_display = ("prefix", "agent", "label", "created_at", "last_used_at", "revoked_at")
    list_filter = (TokenStateFilter,)
    list_select_related = ("agent",)
    search_fields = ("prefix__exact", "agent__name")
    search_help_text = "A token's prefix (ect_ and 8 characters) or an agent's name."
    fields = ("agent", "prefix", "label", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("agent", "prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # issued by the agent's owner on the owner page, never here

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked tokens stay, as the record of what could authenticate when

    @admin.action(description="Revoke", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentToken]) -> None:
        # Revoking stays open to admins: stopping an agent is a correction, not a grant.
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True).select_related("agent"):
            agent_token_revoke_by(token=token, user=request.user)
            revoked += 1
        self.message_user(request, f"{revoked} token(s) revoked; they stop working at once.", messages.SUCCESS)


@admin.register(SecurityEvent)
class SecurityEventAdmin(ReadOnlyAdmin):
    """The security trail: tokens issued, owners changed, approval limits and caps changed."""

    list_display = ("created_at", "kind", "subject", "actor_label", "detail")
    list_filter = ("kind",)
    search_fields = ("subject", "actor_label")
    ordering = ("-created_at",)


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
