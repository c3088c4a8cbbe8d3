"""Proposing a supplier email: validate, render the template, record (docs/architecture.md section 3).

The agent names the supplier, a business reference, the template and its parameters, and the
address (one of the supplier's known contacts). It never sends a subject or a body of its own:
the console renders them here, at proposal time, into the material payload, whose hash the
approval binds. Bad input raises ProposalInvalid naming the field and writes nothing.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from actions.foundation.trail import Actor
from actions.kinds.email_templates import MAX_PARAMETER_LENGTH, all_templates, template_for
from actions.kinds.fields import (
    REFERENCE_PATTERN,
    FieldProblem,
    ProposalInvalid,
    check_evidence,
    check_reference,
)
from actions.kinds.supplier_email import message_id_for, supplier_email_action_id
from actions.models import Action, ActionKind, Supplier
from actions.providers.base import validate_idempotency_key
from actions.services import (
    ProposalResult,
    answers_a_lost_proposal_race,
    existing_or_conflict,
    payload_hash,
    payload_versioned,
    proposal_record,
)

LINE_BREAK = re.compile(r"[\r\n\u2028\u2029\x85\x0b\x0c]")
MAX_ADDRESS_LENGTH = 254


def _check_template(raw: object, problems: list[FieldProblem]) -> Any:
    name = str(raw or "").strip()
    template = template_for(name) if name else None
    if template is None:
        names = ", ".join(t.name for t in all_templates())
        problems.append(
            FieldProblem("template", "required" if not name else "unknown_template", f"Use one of: {names}.")
        )
    return template


def _check_parameters(raw: object, template: Any, problems: list[FieldProblem]) -> dict[str, str]:
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


def _check_address(raw: object, problems: list[FieldProblem]) -> str | None:
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


@answers_a_lost_proposal_race
def supplier_email_propose(
    *,
    supplier: object,
    reference: object,
    template: object,
    parameters: object,
    to: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate a supplier email deterministically, render it and record the proposal.

    The same action id with the same rendered message returns the existing action; with a
    different one (other parameters, another template version, another address) it is a
    conflict. A manager always decides: an email moves no money, and no policy reads it.
    """
    now = now or timezone.now()
    problems: list[FieldProblem] = []
    supplier_code = check_reference("supplier", supplier, problems)
    business_reference = check_reference("reference", reference, problems)
    found = _check_template(template, problems)
    values = _check_parameters(parameters, found, problems)
    address = _check_address(to, problems)
    evidence_text = check_evidence(evidence, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert supplier_code is not None and business_reference is not None and address is not None

    subject, body = found.render(values)
    if LINE_BREAK.search(subject):  # the parameters were checked; this is the last guard
        raise ProposalInvalid([FieldProblem("subject", "header_injection", "The subject contains a line break.")])

    with transaction.atomic(durable=True):
        target = Supplier.objects.filter(code=supplier_code).first()
        if target is None:
            raise ProposalInvalid([FieldProblem("supplier", "not_found", f"There is no supplier {supplier_code}.")])
        if address.lower() not in target.known_addresses():
            raise ProposalInvalid(
                [
                    FieldProblem(
                        "to",
                        "unknown_contact",
                        f"{address} is not one of {target.code}'s known contacts; the console writes only to those.",
                    )
                ]
            )
        action_id = supplier_email_action_id(supplier=target.code, reference=business_reference, template=found.name)
        validate_idempotency_key(action_id)
        payload = payload_versioned({
            "kind": ActionKind.SUPPLIER_EMAIL.value,
            "supplier": target.code,
            "reference": business_reference,
            "template": found.name,
            "template_version": found.version,
            "parameters": values,
            "from": settings.SUPPLIER_EMAIL_FROM,
            "to": address,
            "subject": subject,
            "body": body,
            "message_id": message_id_for(action_id, domain=settings.EMAIL_MESSAGE_ID_DOMAIN),
        })
        digest = payload_hash(payload)
        existing = Action.objects.filter(action_id=action_id).first()
        if existing is not None:
            return existing_or_conflict(existing, payload, digest)
        actor_user = proposer.accountable_user
        action = Action(
            action_id=action_id,
            kind=ActionKind.SUPPLIER_EMAIL,
            idempotency_key=action_id,
            payload=payload,
            payload_hash=digest,
            amount=Decimal("0"),
            currency="",
            reason_code="",
            evidence=evidence_text,
            proposed_by_agent=proposer.agent,
            proposed_by_user=actor_user if getattr(actor_user, "pk", None) else None,
        )
        return proposal_record(
            action=action,
            proposer=proposer,
            now=now,
            policy_reasons=[],
            event_evidence={"payload": payload, "payload_hash": digest, "evidence": evidence_text},
            auto_policy=True,
            reason=f"Rendered from template {found.name} version {found.version}.",
            savepoint=False,
        )


__all__ = ["REFERENCE_PATTERN", "supplier_email_propose"]
