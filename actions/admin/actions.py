"""Actions and their trail: the corrections an admin makes on one action (cancel, reopen, assign
an owner, void a duplicate credit note) go through the same services as everything else."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django_fsm import ConcurrentTransition, Transition, TransitionNotAllowed
from django_fsm.admin import FSMAdminMixin, FSMObjectTransition

from actions.admin.base import (
    AssignOwnerForm,
    CompensationForm,
    CurrencyFilter,
    LargeTableAdmin,
    OutcomeFilter,
    ReadOnlyAdmin,
    ReadOnlyInline,
    TransitionFilter,
    may_correct,
    trail_text,
)
from actions.kinds import DuplicateCorrection, kind_for
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
)
from actions.models.actions import UNRESOLVED_STATUSES
from actions.review.corrections import (
    CorrectionRefused,
    action_owner_assign,
    adjustment_duplicates,
    adjustment_void_duplicate,
)
from actions.search import MIN_TERM_LENGTH, action_number, search_actions
from actions.services import ActionRefused, Actor, action_cancel
from approvals.services import DecisionRefused, action_reopen

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
    reason = trail_text("Why: this goes into the action's audit trail.")


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

    def _action_to_correct(self, request: HttpRequest, object_id: str) -> Action:
        """The action a correction's page names, once the person may change it."""
        obj = self._action(request, object_id)
        if obj is None:
            raise Http404("No such action.")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        return obj

    def _correction_run(self, request: HttpRequest, obj: Action, correct: Callable[[], str]) -> HttpResponse | None:
        """Run a correction's service (``correct`` returns what to tell the person): on success the
        action's page, with the message; a refusal is shown on the correction's page again."""
        try:
            done = correct()
        except CorrectionRefused as refusal:
            self.message_user(request, refusal.message, messages.ERROR)
            return None
        self.message_user(request, done, messages.SUCCESS)
        return redirect("admin:actions_action_change", object_id=obj.pk)

    def assign_owner_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        obj = self._action_to_correct(request, object_id)
        form = AssignOwnerForm(request.POST or None, initial={"owner": obj.owner_id})

        def assign() -> str:
            owner = form.cleaned_data["owner"]
            action_owner_assign(action_pk=obj.pk, owner=owner, user=request.user, reason=form.cleaned_data["reason"])
            return f"{obj.action_id} is now owned by {owner.get_username()}; the audit trail records who and why."

        if request.method == "POST" and form.is_valid():
            done = self._correction_run(request, obj, assign)
            if done is not None:
                return done
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
        obj = self._action_to_correct(request, object_id)
        form = CompensationForm(request.POST or None)
        form.fields["note"].help_text = "Why the credit note is voided: goes into the audit trail and to the manager."

        def void() -> str:
            proposed = adjustment_void_duplicate(action_pk=obj.pk, user=request.user, note=form.cleaned_data["note"])
            return format_html(
                'Void <a href="{}">{}</a> is proposed and waits for a manager\'s approval; the engine '
                "then voids the duplicate credit note. {} and its trail are unchanged.",
                reverse("admin:actions_action_change", args=[proposed.pk]),
                proposed.action_id,
                obj.action_id,
            )

        if request.method == "POST" and form.is_valid():
            done = self._correction_run(request, obj, void)
            if done is not None:
                return done
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
