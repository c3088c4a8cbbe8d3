"""Shared pieces of the admin site: an estimated count for big tables, read-only admins and
inlines, the filters with fixed choices, and who may correct."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest

from actions.foundation.text import validate_plain_text
from actions.kinds.base import Outcome
from actions.models import (
    Action,
    DiscrepancyStatus,
    FollowUpStatus,
)
from actions.review.corrections import (
    CORRECT_PERMISSION,
    owner_candidates,
)

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


class NeverChanged:
    """Rows that are history: visible, never added, edited or deleted here (a list or an inline)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(NeverChanged, LargeTableAdmin):
    """Rows that are history: visible, never added, edited or deleted here."""


class ReadOnlyInline(NeverChanged, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False


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


def trail_text(help_text: str) -> forms.CharField:
    """A person's words for the audit trail: plain text, at most 2,000 characters."""
    return forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        validators=[validate_plain_text],
        help_text=help_text,
    )


class CompensationForm(forms.Form):
    note = trail_text("Why, and how finance should recover the money: goes into the audit trail and to the manager.")


class AssignOwnerForm(forms.Form):
    owner = forms.ModelChoiceField(
        queryset=owner_candidates().none(),
        help_text="The person who works it from now on: someone with the finance role.",
    )
    reason = trail_text("Why: this goes into the action's audit trail.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Fresh per form: roles change while the process runs.
        self.fields["owner"].queryset = owner_candidates()  # type: ignore[attr-defined]
