from __future__ import annotations

import re
from typing import Any

from django import forms

from actions.foundation.text import validate_plain_text
from approvals.models import Decision, RejectionReason
from approvals.services import Shown

# A note is a sentence or two for the audit trail, not a document.
MAX_NOTE_LENGTH = 1000

# Every decision form carries what its page showed (approvals.services.Shown). A form without
# it comes from an old page or from no page at all: the decision is refused, naming the field.
SHOWN_MISSING = "missing: the page sends what it showed with every decision. Reload the page and decide again."
# The target's version as the page showed it, or "none" for a kind that binds to no target.
SHOWN_VERSION = r"^(none|[0-9]{1,9})$"
SHOWN_HASH_LENGTH = 80


def _version(value: str) -> int | None:
    return None if value == "none" else int(value)


def page_version(raw: object) -> str:
    """The target's version a page showed, as its card's forms and poll send it; empty when it
    is missing or not a version."""
    return raw if isinstance(raw, str) and re.fullmatch(SHOWN_VERSION, raw) else ""


class DecisionForm(forms.Form):
    """What the inbox row posts: which button was pressed, an optional note, and what the page
    showed of the proposal (its target's version, amount and payload hash)."""

    decision = forms.ChoiceField(choices=Decision.choices)
    shown_version = forms.RegexField(
        regex=SHOWN_VERSION, error_messages={"required": SHOWN_MISSING, "invalid": "not a version the page shows."}
    )
    shown_amount = forms.DecimalField(max_digits=14, decimal_places=2, error_messages={"required": SHOWN_MISSING})
    shown_payload_hash = forms.CharField(max_length=SHOWN_HASH_LENGTH, error_messages={"required": SHOWN_MISSING})
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])
    # Required for a rejection (the service says so in words); ignored for an approval.
    reason_code = forms.ChoiceField(
        choices=[("", "Choose a reason"), *RejectionReason.choices],
        required=False,
        error_messages={"invalid_choice": "Choose one of the listed reasons."},
    )

    def shown(self) -> Shown:
        data = self.cleaned_data
        return Shown(
            version=_version(data["shown_version"]),
            amount=data["shown_amount"],
            payload_hash=data["shown_payload_hash"],
        )


class GroupDecisionForm(forms.Form):
    """Several proposals on one target, approved together as one decision. The ticked proposals
    come as repeated ``action`` values; ``action_pks`` reads them. What the page showed comes
    as the target's version the group card showed (``shown_version``) and, per proposal pk,
    ``shown_amount_<pk>`` and ``shown_payload_hash_<pk>``; ``shown`` reads them."""

    group = forms.RegexField(regex=r"^(order|bill)-[0-9]+$", max_length=40)
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])
    shown_version = forms.RegexField(
        regex=SHOWN_VERSION, error_messages={"required": SHOWN_MISSING, "invalid": "not a version the page shows."}
    )

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        values = self.data.getlist("action") if hasattr(self.data, "getlist") else []
        if not values or not all(str(v).isdigit() and len(str(v)) < 19 for v in values):
            raise forms.ValidationError("Tick the proposals to approve together.")
        pks = sorted({int(v) for v in values})
        cleaned["action_pks"] = pks
        if "shown_version" in cleaned:
            cleaned["shown"] = self._shown(pks, version=_version(str(cleaned["shown_version"])))
        return cleaned

    def _shown(self, pks: list[int], *, version: int | None) -> dict[int, Shown]:
        amount = forms.DecimalField(max_digits=14, decimal_places=2, error_messages={"required": SHOWN_MISSING})
        payload_hash = forms.CharField(max_length=SHOWN_HASH_LENGTH, error_messages={"required": SHOWN_MISSING})
        shown: dict[int, Shown] = {}
        problems: list[str] = []
        for pk in pks:
            values = [
                self._clean_one(field, f"{name}_{pk}", problems)
                for field, name in ((amount, "shown_amount"), (payload_hash, "shown_payload_hash"))
            ]
            if None not in values:
                shown[pk] = Shown(version=version, amount=values[0], payload_hash=values[1])
        if problems:
            raise forms.ValidationError(problems)
        return shown

    def _clean_one(self, field: forms.Field, name: str, problems: list[str]) -> Any:
        try:
            return field.clean(self.data.get(name))
        except forms.ValidationError as error:
            problems.append(f"{name}: {' '.join(error.messages)}")
            return None


class ReopenForm(forms.Form):
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])


def form_problem(form: forms.Form) -> str:
    """The form's errors as one sentence naming each field, for the row's message."""
    parts = []
    for name, errors in form.errors.items():
        label = {"__all__": "form", "reason_code": "reason", "action": "proposals"}.get(name, name)
        parts.append(f"{label}: {' '.join(str(e) for e in errors)}")
    return "Nothing was changed. " + "; ".join(parts)
