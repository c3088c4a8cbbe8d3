"""Supplier email templates: registered in code, by name and version, plain text only.

An agent names a template and gives its parameters; it never sends text of its own for the
subject or the body. The console renders the template at proposal time and stores the result
in the material payload, so what the manager approves is byte for byte what is sent. A
changed wording is a new version; an action keeps the version it was rendered from.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

MAX_PARAMETER_LENGTH = 500


@dataclass(frozen=True)
class EmailTemplate:
    name: str
    version: int
    subject: str  # string.Template text: $name placeholders, nothing else
    body: str

    @property
    def parameters(self) -> tuple[str, ...]:
        names: list[str] = []
        for text in (self.subject, self.body):
            for name in string.Template(text).get_identifiers():
                if name not in names:
                    names.append(name)
        return tuple(names)

    @property
    def subject_parameters(self) -> tuple[str, ...]:
        return tuple(string.Template(self.subject).get_identifiers())

    def render(self, parameters: dict[str, str]) -> tuple[str, str]:
        """(subject, body). ``parameters`` must hold every name (checked by the caller)."""
        return (
            string.Template(self.subject).substitute(parameters),
            string.Template(self.body).substitute(parameters),
        )


_TEMPLATES: dict[str, EmailTemplate] = {}


def template_register(template: EmailTemplate) -> EmailTemplate:
    """The latest version registered under a name is the one new proposals use."""
    current = _TEMPLATES.get(template.name)
    if current is None or template.version >= current.version:
        _TEMPLATES[template.name] = template
    return template


def template_for(name: str) -> EmailTemplate | None:
    return _TEMPLATES.get(name)


def all_templates() -> list[EmailTemplate]:
    return sorted(_TEMPLATES.values(), key=lambda template: template.name)


template_register(
    EmailTemplate(
        name="bill_adjusted",
        version=1,
        subject="Bill $bill_number: adjusted by $amount $currency",
        body=(
            "Dear $supplier_name,\n"
            "\n"
            "We have adjusted your bill $bill_number by $amount $currency.\n"
            "Reason: $reason\n"
            "\n"
            "A credit note follows separately. Please reply to this message if anything is unclear.\n"
            "\n"
            "Accounts payable\n"
        ),
    )
)
template_register(
    EmailTemplate(
        name="po_mismatch_query",
        version=1,
        subject="Bill $bill_number does not match purchase order $po_number",
        body=(
            "Dear $supplier_name,\n"
            "\n"
            "Your bill $bill_number does not match our purchase order $po_number.\n"
            "What differs: $difference\n"
            "\n"
            "We will pay the bill once it matches the order. Please send a corrected bill, or reply "
            "to this message if the order is wrong.\n"
            "\n"
            "Accounts payable\n"
        ),
    )
)
