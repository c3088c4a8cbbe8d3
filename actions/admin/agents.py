"""Agents, their tokens and the security trail: an admin manages agents but never issues their
tokens."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from actions.admin.base import LargeTableAdmin, ReadOnlyAdmin, ReadOnlyInline
from actions.agents.services import (
    OWNER_CHANGE_BLOCKING_STATUSES,
    AgentChangeRefused,
    agent_owner_change,
    agent_owner_refusal,
    agent_scope_choices,
    agent_token_revoke_by,
)
from actions.foundation.text import validate_plain_text
from actions.models import (
    Action,
    Agent,
    AgentToken,
    SecurityEvent,
)

# --- agents and their tokens -----------------------------------------------------------------


class AgentForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        # A callable, read when the form is built: the kinds registered at that moment.
        choices=agent_scope_choices,
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
