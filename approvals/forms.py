from __future__ import annotations

from django import forms

from actions.text import validate_plain_text
from approvals.models import Decision

# A note is a sentence or two for the audit trail, not a document.
MAX_NOTE_LENGTH = 1000


class DecisionForm(forms.Form):
    """What the inbox row posts: which button was pressed, and an optional note."""

    decision = forms.ChoiceField(choices=Decision.choices)
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])


class ReopenForm(forms.Form):
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH, strip=True, validators=[validate_plain_text])


def form_problem(form: forms.Form) -> str:
    """The form's errors as one sentence naming each field, for the row's message."""
    parts = []
    for name, errors in form.errors.items():
        label = name if name != "__all__" else "form"
        parts.append(f"{label}: {' '.join(str(e) for e in errors)}")
    return "Nothing was changed. " + "; ".join(parts)
