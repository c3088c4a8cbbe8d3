"""Every admin form field with choices keeps what is stored (docs/architecture.md section 1: admins
correct mistakes; a form that silently drops a stored value makes one).

For each ModelAdmin registered on the admin site, the change form is built for an instance
holding each value the model may store; the form must show that value among its choices and,
saved as shown, give it back unchanged. A field with choices that the model does not declare
(a JSON list of scopes) must name its stored values in ``STORED_VALUES`` below, so that a new
such field cannot escape the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django import forms
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.test import RequestFactory

from actions.agents.services import agent_scope_choices
from actions.kinds import all_kinds
from actions.models import Agent, OwnerGroup
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def _scope_values() -> list[Any]:
    scopes = [scope for scope, _ in agent_scope_choices()]
    # Each scope alone, and all of them together: saving must keep every one.
    return [[scope] for scope in scopes] + [scopes]


# Fields whose choices the model does not declare: what the model may store in them, read from
# the rule that accepts them (agent_create refuses any other scope).
STORED_VALUES = {
    (Agent, "scopes"): _scope_values,
    # An owner group may be named for any registered kind (owner_group_of reads it for each).
    (OwnerGroup, "kind"): lambda: [kind.name for kind in all_kinds()],
}


def _choice_fields(form_class: type[forms.ModelForm[Any]]) -> Iterator[str]:
    for name, field in form_class.base_fields.items():
        if isinstance(field, forms.ChoiceField) and not isinstance(field, forms.ModelChoiceField):
            yield name


def _stored_values(model: type[models.Model], name: str) -> list[Any]:
    if (model, name) in STORED_VALUES:
        return STORED_VALUES[(model, name)]()
    try:
        model_field: Any = model._meta.get_field(name)
    except FieldDoesNotExist:
        return []  # a form-only field (the user form's "usable password"): it stores nothing
    assert model_field.choices, (
        f"{model.__name__}.{name} has choices in the admin's form but none in the model: name its stored values "
        "in STORED_VALUES"
    )
    return [value for value, _ in model_field.flatchoices if value not in ("", None)]


def _admin_forms() -> Iterator[tuple[type[models.Model], type[forms.ModelForm[Any]]]]:
    request = RequestFactory().get("/admin/")
    request.user = make_user("admin-choices", is_superuser=True, is_staff=True)
    for model in apps.get_models():
        if not admin.site.is_registered(model):
            continue
        model_admin = admin.site.get_model_admin(model)
        # As the admin's own change view builds its form: only where the admin may add or
        # change (elsewhere every field is shown read-only, not as a choice).
        for obj in (None, model()):
            may = (
                model_admin.has_add_permission(request)
                if obj is None
                else model_admin.has_change_permission(request, obj)
            )
            if may:
                fields = flatten_fieldsets(model_admin.get_fieldsets(request, obj))
                yield model, model_admin.get_form(request, obj, change=obj is not None, fields=fields)


def test_every_admin_choice_field_round_trips_what_is_stored() -> None:
    checked = []
    for model, form_class in _admin_forms():
        for name in _choice_fields(form_class):
            for stored in _stored_values(model, name):
                instance = model(**{name: stored})
                bound = form_class(instance=instance)[name]
                shown = bound.value()
                where = f"{model.__name__}.{name} = {stored!r}"
                try:
                    kept = bound.field.clean(shown)
                except forms.ValidationError as refused:
                    pytest.fail(f"{where}: the admin's form does not offer it ({refused.messages})")
                if isinstance(stored, list):
                    assert sorted(kept) == sorted(stored), where
                    assert all(_ticked(str(bound), scope) for scope in stored), f"{where}: not ticked"
                else:
                    assert str(kept) == str(stored), where
                checked.append(where)
    # The agent's scopes are among the fields checked, each scope of the registry.
    assert any(where.startswith("Agent.scopes") for where in checked)


def _ticked(html: str, value: str) -> bool:
    for tag in html.split("<input")[1:]:
        tag = tag.split(">", 1)[0]
        if f'value="{value}"' in tag and "checked" in tag:
            return True
    return False


def test_the_agent_form_offers_every_scope_an_agent_may_hold() -> None:
    scopes: Any = admin.site.get_model_admin(Agent).form.base_fields["scopes"]
    offered = {value for value, _ in scopes.choices}
    assert {"refund", "orders", "supplier_email", "invoice_adjustment"} <= offered
