"""The supplier email proposal's checks, each a named step: they read, they never write.

The agent names the supplier, a business reference, the template and its parameters, and the
address (one of the supplier's known contacts). It never sends a subject or a body of its own:
the console renders them at proposal time into the material payload, whose hash the approval
binds. Bad input raises ``ProposalInvalid`` naming its field (invariant 11).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from actions.kinds.email_templates import MAX_PARAMETER_LENGTH, EmailTemplate, all_templates, template_for
from actions.kinds.fields import FieldProblem, ProposalInvalid, check_evidence, check_reference
from actions.kinds.supplier_email.contract import message_id_for
from actions.models import ActionKind, Supplier

LINE_BREAK = re.compile(r"[\r\n\u2028\u2029\x85\x0b\x0c]")
MAX_ADDRESS_LENGTH = 254


def template_check(raw: object, problems: list[FieldProblem]) -> EmailTemplate | None:
    name = str(raw or "").strip()
    template = template_for(name) if name else None
    if template is None:
        names = ", ".join(t.name for t in all_templates())
        problems.append(
            FieldProblem("template", "required" if not name else "unknown_template", f"Use one of: {names}.")
        )
    return template


def parameters_check(raw: object, template: Any, problems: list[FieldProblem]) -> dict[str, str]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(FieldProblem("parameters", "invalid_type", "Give the parameters as an object of strings."))
        return {}
    values: dict[str, str] = {}
    for name, value in raw.items():
        field = f"parameters.{name}"
        if template is not None and name not in template.parameters:
            problems.append(
                FieldProblem(field, "unknown_parameter", f"{template.name} has no parameter {str(name)[:40]!r}.")
            )
            continue
        if not isinstance(value, str | int) or isinstance(value, bool):
            problems.append(FieldProblem(field, "invalid_type", "Give the parameter as a string."))
            continue
        text = str(value)
        if "\x00" in text:
            problems.append(FieldProblem(field, "invalid_characters", "The parameter contains a NUL character."))
        elif len(text) > MAX_PARAMETER_LENGTH:
            problems.append(FieldProblem(field, "too_long", f"Keep it under {MAX_PARAMETER_LENGTH} characters."))
        elif template is not None and name in template.subject_parameters and LINE_BREAK.search(text):
            problems.append(
                FieldProblem(
                    field,
                    "header_injection",
                    "The parameter goes into the subject, which is a header: it must not contain a line break.",
                )
            )
        elif not text.strip():
            problems.append(FieldProblem(field, "required", "The parameter is empty."))
        else:
            values[name] = text
    if template is not None:
        for name in template.parameters:
            if name not in raw:
                problems.append(
                    FieldProblem(f"parameters.{name}", "required", f"{template.name} needs the parameter {name}.")
                )
    return values


def address_check(raw: object, problems: list[FieldProblem]) -> str | None:
    address = str(raw or "")
    if LINE_BREAK.search(address):
        problems.append(FieldProblem("to", "header_injection", "An address must not contain a line break."))
        return None
    address = address.strip()
    if not address:
        problems.append(FieldProblem("to", "required", "Name the supplier contact to write to."))
        return None
    try:
        if len(address) > MAX_ADDRESS_LENGTH or "\x00" in address or "," in address:
            raise ValidationError("invalid")
        validate_email(address)
    except ValidationError:
        problems.append(FieldProblem("to", "invalid", "Give one email address, like ap@supplier.example."))
        return None
    return address


@dataclass(frozen=True)
class EmailFields:
    """A supplier email proposal's fields, each checked on its own, and the rendered message."""

    supplier: str
    reference: str
    template: EmailTemplate
    parameters: dict[str, str]
    to: str
    evidence: str
    subject: str
    body: str


def email_fields_check(
    *, supplier: object, reference: object, template: object, parameters: object, to: object, evidence: object
) -> EmailFields:
    """Each field on its own (every bad one is named at once), then the message rendered from
    the template, before anything is read."""
    problems: list[FieldProblem] = []
    supplier_code = check_reference("supplier", supplier, problems)
    business_reference = check_reference("reference", reference, problems)
    found = template_check(template, problems)
    values = parameters_check(parameters, found, problems)
    address = address_check(to, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert supplier_code is not None and business_reference is not None and address is not None
    assert found is not None
    subject, body = found.render(values)
    if LINE_BREAK.search(subject):  # the parameters were checked; this is the last guard
        raise ProposalInvalid.for_field("subject", "header_injection", "The subject contains a line break.")
    return EmailFields(
        supplier=supplier_code,
        reference=business_reference,
        template=found,
        parameters=values,
        to=address,
        evidence=evidence_text,
        subject=subject,
        body=body,
    )


def supplier_contact_resolve(fields: EmailFields) -> Supplier:
    """The supplier, with the address among its known contacts: the console writes only to those."""
    target = Supplier.objects.filter(code=fields.supplier).first()
    if target is None:
        raise ProposalInvalid.for_field("supplier", "not_found", f"There is no supplier {fields.supplier}.")
    if fields.to.lower() not in target.known_addresses():
        raise ProposalInvalid.for_field(
            "to",
            "unknown_contact",
            f"{fields.to} is not one of {target.code}'s known contacts; the console writes only to those.",
        )
    return target


def email_payload(target: Supplier, fields: EmailFields, *, action_id: str) -> dict[str, Any]:
    """The material payload: the rendered message, byte for byte what is sent, under a
    Message-ID derived from the action id."""
    return {
        "kind": ActionKind.SUPPLIER_EMAIL.value,
        "supplier": target.code,
        "reference": fields.reference,
        "template": fields.template.name,
        "template_version": fields.template.version,
        "parameters": fields.parameters,
        "from": settings.SUPPLIER_EMAIL_FROM,
        "to": fields.to,
        "subject": fields.subject,
        "body": fields.body,
        "message_id": message_id_for(action_id, domain=settings.EMAIL_MESSAGE_ID_DOMAIN),
    }
