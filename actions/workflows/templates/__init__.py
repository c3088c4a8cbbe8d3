"""Workflow templates, registered in code: a name, a parameter schema, ordered steps.

Each step names an effect kind (or ``read``), its step class, how its payload is built from the
parameters, and its compensation: another kind's payload, or "none" with the reason. The plan a
template builds is fixed at proposal time; its hash is what the approval binds.

Shipped templates (docs/architecture.md section 10):

``po_mismatch_resolution``
  1. ``read_documents`` (read): the bill as the accounting system holds it and the purchase
     order's mismatch as the matcher found it. Saved as evidence; recovery reuses it.
  2. ``post_credit_note`` (create): the credit note. Compensation: void it (a set step).
  3. ``email_supplier`` (irreversible): tell the supplier. Compensation: a correction email.

``refund_with_notice``
  1. ``refund`` (irreversible, money). Compensation: none. Money returned to a customer cannot be
     taken back by the console; a failed refund opens a remedy (store credit, transfer, cheque).
  2. ``notify_customer`` (irreversible, last). Compensation: none, it is the last step, so no
     later step can fail after it and ask for it to be walked back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from actions.kinds import StepClass, kind_for
from actions.kinds.fields import REFERENCE_PATTERN
from actions.models import Action
from actions.services import payload_hash

READ = "read"
MAX_ACTION_ID = 255


@dataclass(frozen=True)
class StepSpec:
    name: str
    kind: str  # an effect kind's name, or READ
    step_class: StepClass
    # The compensation's kind, or None for "none"; ``compensation_note`` says what it does, or
    # why there is none and what happens instead.
    compensation_kind: str | None
    compensation_note: str
    # A read step's read: the step's payload in, the evidence to save out. The coordinator runs
    # it outside any transaction and saves its first result for every later run to reuse.
    read: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Proposal:
    """A validated proposal: the ids and the plan, before anything is written."""

    workflow_id: str
    case: str
    parameters: dict[str, Any]
    plan: dict[str, Any]
    plan_hash: str


@dataclass(frozen=True)
class Template:
    name: str
    label: str
    parameters: dict[str, str]  # name -> description (the schema, for people and the API docs)
    steps: tuple[StepSpec, ...]
    validate: Callable[[dict[str, Any]], Proposal]
    # Why an irreversible step is not last, where one is not; empty when they are all last.
    order_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def spec(self, name: str) -> StepSpec:
        return next(step for step in self.steps if step.name == name)


_TEMPLATES: dict[str, Template] = {}


def template_register(template: Template) -> Template:
    """Register a template after checking its rules: irreversible steps last (unless the template
    says why not) and every compensation either a kind or a reason."""
    seen_irreversible = False
    for spec in template.steps:
        if spec.step_class == StepClass.IRREVERSIBLE:
            seen_irreversible = True
        elif seen_irreversible and not template.order_note:
            raise ValueError(f"{template.name}: irreversible steps go last unless the template says why")
        if spec.compensation_kind is None and not spec.compensation_note:
            raise ValueError(f"{template.name}.{spec.name}: a step without compensation needs the reason")
        if (spec.kind == READ) != (spec.read is not None):
            raise ValueError(f"{template.name}.{spec.name}: a read step, and only a read step, names its read")
    _TEMPLATES[template.name] = template
    return template


def template_for(name: str) -> Template | None:
    return _TEMPLATES.get(name)


def registered_template(name: str) -> Template:
    """A template that registers itself when its module is imported (this package imports them)."""
    template = template_for(name)
    assert template is not None, f"{name} is registered when its module is imported"
    return template


def all_templates() -> list[Template]:
    return sorted(_TEMPLATES.values(), key=lambda template: template.name)


def plan_hash_of(template: str, steps: list[dict[str, Any]]) -> str:
    """The plan's identity: its template and each step's material parts. The workflow id is not
    in it, so the same plan proposed under another case reference is recognised as the same."""
    material = [
        {key: step.get(key) for key in ("name", "kind", "amount", "currency", "target", "payload", "compensation")}
        for step in steps
    ]
    text = json.dumps({"template": template, "steps": material}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# --- child actions -----------------------------------------------------------------------------


def step_key(workflow_id: str, step: str) -> str:
    return f"{workflow_id}:{step}"


def compensation_key(workflow_id: str, step: str) -> str:
    return f"{workflow_id}:{step}:compensate"


def child_action(
    *, workflow_id: str, step: dict[str, Any], key: str, payload: dict[str, Any], kind: str, evidence: str = ""
) -> Action:
    """The unsaved child action for a step or a compensation: its key, its payload (with the
    workflow's name in it, which the trail reads to wake the coordinator) and its target."""
    full = {**payload, "workflow": workflow_id, "step": step["name"]}
    money = Decimal(payload["amount"]) if kind_for(kind).moves_money and payload.get("amount") else Decimal("0")
    action = Action(
        action_id=key,
        kind=kind,
        idempotency_key=key,
        payload=full,
        payload_hash=payload_hash(full),
        amount=money,
        currency=str(payload.get("currency", "")) if money else "",
        reason_code=str(payload.get("reason_code", "")),
        evidence=evidence,
    )
    kind_for(kind).bind_target(action, payload)
    return action


def plan_actions(workflow_id: str, plan: dict[str, Any]) -> list[tuple[dict[str, Any], Action | None]]:
    """Each planned step with its unsaved child action (None for a read step): for the plan's
    page (receivers, previews) and for the approval's binding (target versions)."""
    return [
        (
            step,
            None
            if step["kind"] == READ
            else child_action(
                workflow_id=workflow_id,
                step=step,
                key=step_key(workflow_id, step["name"]),
                payload=step["payload"],
                kind=step["kind"],
            ),
        )
        for step in plan["steps"]
    ]


def plan_totals(plan: dict[str, Any]) -> dict[str, str]:
    totals: dict[str, Decimal] = {}
    for step in plan["steps"]:
        if step.get("amount") and step.get("currency"):
            totals[step["currency"]] = totals.get(step["currency"], Decimal("0")) + Decimal(step["amount"])
    return {currency: str(total) for currency, total in sorted(totals.items())}


# The shipped templates register themselves on import.
from actions.workflows.templates import po_mismatch, refund_with_notice  # noqa: E402, F401

__all__ = [
    "READ",
    "REFERENCE_PATTERN",
    "Proposal",
    "StepSpec",
    "Template",
    "all_templates",
    "child_action",
    "compensation_key",
    "plan_actions",
    "plan_totals",
    "step_key",
    "template_for",
]
