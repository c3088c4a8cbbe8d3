"""What every template's validation builds with: a step's entry in the plan, the parameters' checks,
an email's payload and the workflow's ids."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django.conf import settings

from actions.kinds import kind_for
from actions.kinds.email_templates import EmailTemplate, template_for
from actions.kinds.fields import (
    FieldProblem,
    ProposalInvalid,
    check_currency,
    parse_amount,
)
from actions.kinds.supplier_email.contract import message_id_for
from actions.workflows.templates import MAX_ACTION_ID, READ, Proposal, StepSpec, Template, plan_hash_of


def step_entry(
    spec: StepSpec,
    position: int,
    *,
    target: dict[str, Any],
    payload: dict[str, Any],
    amount: Decimal | None = None,
    currency: str = "",
    compensation_payload: dict[str, Any] | None = None,
) -> dict[str, Any]:
    receiver = "the console (reads only)" if spec.kind == READ else kind_for(spec.kind).contract().receiver
    return {
        "position": position,
        "name": spec.name,
        "kind": spec.kind,
        "step_class": str(spec.step_class),
        "receiver": receiver,
        "target": target,
        "amount": str(amount) if amount is not None else None,
        "currency": currency,
        "payload": payload,
        "compensation": {
            "kind": spec.compensation_kind,
            "note": spec.compensation_note,
            "payload": compensation_payload,
        },
    }


def parameter_problems(problems: list[FieldProblem]) -> list[FieldProblem]:
    """The shared checks name their fields bare ("amount"); here they are parameters."""
    return [
        p if p.field.startswith("parameters.") else FieldProblem(f"parameters.{p.field}", p.code, p.message)
        for p in problems
    ]


def parameters_dict(raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProposalInvalid([FieldProblem("parameters", "invalid_type", "Give the parameters as an object.")])
    return raw


def unknown_parameters(raw: dict[str, Any], template: Template, problems: list[FieldProblem]) -> None:
    for name in sorted(set(raw) - set(template.parameters)):
        problems.append(
            FieldProblem(f"parameters.{str(name)[:40]}", "unknown_parameter", f"{template.name} has no such parameter.")
        )


def parameters_checked(raw_input: object, template: Template) -> tuple[dict[str, Any], list[FieldProblem]]:
    """The parameters as an object, and the problems found so far (any parameter the template does
    not name), for the template's own checks to add to."""
    raw = parameters_dict(raw_input)
    problems: list[FieldProblem] = []
    unknown_parameters(raw, template, problems)
    return raw, problems


def money_parameters(raw: dict[str, Any], problems: list[FieldProblem]) -> tuple[str | None, Decimal | None]:
    """The currency and the amount in it, each checked as a lone proposal checks them."""
    currency = check_currency(raw.get("currency"), problems)
    return currency, parse_amount(raw.get("amount"), currency, problems)


def reason_parameter(raw: dict[str, Any], allowed: Sequence[str], problems: list[FieldProblem]) -> str:
    """The reason code, which must be one of ``allowed``."""
    reason = str(raw.get("reason_code") or "")
    if reason not in allowed:
        problems.append(
            FieldProblem("parameters.reason_code", "unknown_reason_code", f"Use one of: {', '.join(allowed)}.")
        )
    return reason


def one_line_text(name: str, raw: object, problems: list[FieldProblem], *, limit: int = 500) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        problems.append(FieldProblem(name, "required", "Give a non-empty string."))
        return None
    if len(raw) > limit or "\x00" in raw or "\n" in raw or "\r" in raw:
        problems.append(FieldProblem(name, "invalid", f"One line of at most {limit} characters."))
        return None
    return raw.strip()


def email_payload(
    template: EmailTemplate, values: dict[str, str], *, action_key: str, sender: str, to: str
) -> dict[str, Any]:
    subject, body = template.render(values)
    return {
        "template": template.name,
        "template_version": template.version,
        "parameters": values,
        "from": sender,
        "to": to,
        "subject": subject,
        "body": body,
        "message_id": message_id_for(action_key, domain=settings.EMAIL_MESSAGE_ID_DOMAIN),
    }


def registered_email(name: str) -> EmailTemplate:
    """An email template registered with the supplier emails, so that a workflow's message and
    a lone supplier email of the same name read the same."""
    template = template_for(name)
    if template is None:
        raise LookupError(f"no email template is registered as {name}")
    return template


def parameter_problems_raise(problems: list[FieldProblem]) -> None:
    """All the bad parameters at once, each named as a parameter; nothing when there are none."""
    if problems:
        raise ProposalInvalid(parameter_problems(problems))


def parameter_refusal(name: str, code: str, message: str) -> ProposalInvalid:
    """One parameter refused by what the console holds (after the checks of each field passed)."""
    return ProposalInvalid([FieldProblem(name, code, message)])


def workflow_proposal(
    template: Template,
    *,
    workflow_id: str,
    case: str,
    parameters: dict[str, Any],
    steps: list[dict[str, Any]],
    evidence: str,
) -> Proposal:
    # The Message-IDs are derived from the workflow id; the plan hash must not be (see
    # plan_hash_of), so it is taken of the steps without them.
    return Proposal(
        workflow_id=workflow_id,
        case=case,
        parameters=parameters,
        plan={"template": template.name, "steps": steps, "evidence": evidence},
        plan_hash=plan_hash_of(template.name, without_message_ids(steps)),
    )


def workflow_ids(prefix: str, business: str, case_ref: str) -> tuple[str, str]:
    workflow_id = f"{prefix}:{business}:{case_ref}"
    # The longest child key must still fit the receivers' key limit.
    if len(workflow_id) + len(":post_credit_note:compensate") > MAX_ACTION_ID:
        raise ProposalInvalid([FieldProblem("parameters.case", "too_long", "The workflow id would be too long.")])
    return workflow_id, f"{prefix}:{business}"


def without_message_ids(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cleaned = json.loads(json.dumps(steps))
    for step in cleaned:
        step["payload"].pop("message_id", None)
        payload = step["compensation"].get("payload") or {}
        payload.pop("message_id", None)
        payload.pop("adjustment", None)
        step["payload"].pop("adjustment", None)
    return list(cleaned)
