from __future__ import annotations

from django import forms

from actions.text import validate_plain_text
from approvals.models import Decision, RejectionReason

# A note is a sentence or two for the audit trail, not a document.
MAX_NOTE_LENGTH = 1000


class DecisionForm(forms.Form):
    """What the inbox row posts: which button was pressed, and an optional note."""

    decision = forms.ChoiceField(choices=Decision.choices)
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])
    # Required for a rejection (the service says so in words); ignored for an approval.
    reason_code = forms.ChoiceField(
        choices=[("", "Choose a reason"), *RejectionReason.choices],
        required=False,
        error_messages={"invalid_choice": "Choose one of the listed reasons."},
    )


class GroupDecisionForm(forms.Form):
    """Several proposals on one target, approved together as one decision. The ticked proposals
    come as repeated ``action`` values; ``action_pks`` reads them."""

    group = forms.RegexField(regex=r"^(order|bill)-[0-9]+$", max_length=40)
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        values = self.data.getlist("action") if hasattr(self.data, "getlist") else []
        if not values or not all(str(v).isdigit() and len(str(v)) < 19 for v in values):
            raise forms.ValidationError("Tick the proposals to approve together.")
        cleaned["action_pks"] = sorted({int(v) for v in values})
        return cleaned


class ReopenForm(forms.Form):
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])


def form_problem(form: forms.Form) -> str:
    """The form's errors as one sentence naming each field, for the row's message."""
    parts = []
    for name, errors in form.errors.items():
        label = {"__all__": "form", "reason_code": "reason", "action": "proposals"}.get(name, name)
        parts.append(f"{label}: {' '.join(str(e) for e in errors)}")
    return "Nothing was changed. " + "; ".join(parts)
