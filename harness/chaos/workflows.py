"""The chaos run's workflows: po_mismatch_resolution plans proposed through the API alongside the
run's single actions, run by the same killed and faulted workers, and audited at the end.

Kept out of ``harness.chaos.run`` so that the run's own module only gains a few hook calls. What it
reports, for workflows (docs/architecture.md section 10, invariants 12 to 16):
- duplicates: a step or a compensation with more than one effect at its receiver;
- lost: a workflow neither final nor waiting for a named person, or a step never started;
- compensations run twice: more than one effect (or confirmed void) for a compensation key;
- compensations run while an outcome was unknown: a compensation created while some step of its
  workflow was SUBMITTING, UNKNOWN, SETTLING or NEEDS_REVIEW, reconstructed from the trail;
- order: a step proposed before the step before it was recorded SUCCEEDED.
The per-kind duplicates and lost of the children are also in the run's main audit, which reads
every action.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import urllib.error
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from actions.engine.resolution_checks import ReviewRefused
from actions.engine.resolutions import action_resolve_failed, action_resolve_succeeded
from actions.kinds.base import Effect
from actions.kinds.supplier_email.contract import message_reference
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    Bill,
    Supplier,
    SupplierContact,
    Workflow,
    WorkflowEvent,
    WorkflowState,
    WorkflowStep,
)
from actions.models.attempts import AttemptKind
from actions.workflows.coordinator import workflow_advance
from actions.workflows.services import PlanDecisionRefused, plan_decide

if TYPE_CHECKING:
    from harness.chaos.run import ChaosRun

S = ActionStatus
W = WorkflowState
UNRESOLVED = {S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW}
WAITING_WITH_OWNER = {W.PAUSED, W.COMPENSATING, W.FAILED}
CHAOS_SUPPLIER = "CHAOS"
CHAOS_CONTACT = "ap@chaos-supplier.example"
# A contact whose mail server refuses every message for good (550): every fourth workflow writes
# to it, so its email step fails and the credit note before it is compensated (voided).
REFUSING_CONTACT = "ap-refuses@chaos-supplier.example"


class WorkflowChaos:
    def __init__(self, run: ChaosRun) -> None:
        self.run = run
        self.bills: list[str] = []
        self.proposed = 0
        self.errors = 0
        self.prefix = ""

    def planned(self) -> int:
        """At least the configured share of the run's work (single actions, emails, workflows)."""
        config = self.run.config
        if not config.adjustments or config.workflow_share <= 0:
            return 0  # no accounting sandbox in this run
        others = config.actions + config.emails
        share = config.workflow_share
        return math.ceil(others * share / (1 - share))

    # --- seeding and proposing ---------------------------------------------------------------

    def seed(self) -> None:
        from harness.chaos.run import _http, _now

        self.prefix = f"po-mismatch:bill-CW{self.run.stamp}-"
        supplier = Supplier.objects.get(code=CHAOS_SUPPLIER)
        SupplierContact.objects.get_or_create(supplier=supplier, email=REFUSING_CONTACT)
        for index in range(self.planned()):
            number = f"CW{self.run.stamp}-{index:05d}"
            bill = Bill.objects.create(
                number=number,
                supplier_name="Chaos Supplies",
                currency="EUR",
                amount=Decimal("200.00"),
                amount_due=Decimal("200.00"),
                accounting_reference=f"inv-chaosw-{self.run.stamp}-{index:05d}",
                purchase_order=f"PO-{number}",
                po_mismatch={"summary": "Chaos run workflow: unit price above the purchase order."},
                issued_at=_now() - timedelta(days=1),
            )
            _http(
                "POST",
                f"{self.run.accounting_url}/_sandbox/invoices",
                {
                    "InvoiceID": bill.accounting_reference,
                    "InvoiceNumber": bill.number,
                    "Contact": bill.supplier_name,
                    "CurrencyCode": "EUR",
                    "Total": "200.00",
                },
            )
            self.bills.append(number)

    def jobs(self) -> list[Callable[[], None]]:
        return [
            functools.partial(self._propose, number, REFUSING_CONTACT if index % 4 == 3 else CHAOS_CONTACT)
            for index, number in enumerate(self.bills)
        ]

    def _propose(self, bill_number: str, to: str) -> None:
        import time

        from harness.chaos.run import _http

        body = {
            "template": "po_mismatch_resolution",
            "parameters": {
                "bill_number": bill_number,
                "case": "case-1",
                "amount": f"{self.run.rng.randint(5, 60)}.00",
                "currency": "EUR",
                "reason_code": "price_mismatch",
                "supplier": CHAOS_SUPPLIER,
                "to": to,
                "explanation": "Chaos run: unit price above the purchase order.",
            },
        }
        headers = {"Authorization": f"Bearer {self.run.token}"}
        for _attempt in range(20):
            try:
                _http("POST", f"{self.run.api_url()}/api/v1/workflows", body, headers)
                with self.run.lock:
                    self.proposed += 1
                return
            except urllib.error.HTTPError as error:
                # A 5xx (the database restarting) is retried: the same plan returns the same workflow.
                if error.code < 500:
                    with self.run.lock:
                        self.errors += 1
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        with self.run.lock:
            self.errors += 1

    # --- during the run ----------------------------------------------------------------------

    def workflows(self) -> Any:
        return Workflow.objects.filter(workflow_id__startswith=self.prefix) if self.prefix else Workflow.objects.none()

    def children(self) -> Any:
        return Action.objects.filter(action_id__startswith=self.prefix) if self.prefix else Action.objects.none()

    def refusal_ensure(self) -> None:
        """The refusing contact's server refuses for good, through every change of the run's
        random faults (which clear the sandbox's list)."""
        from harness.chaos.run import _http

        if not self.prefix or not self.run.mail_url:
            return
        faults = _http("GET", f"{self.run.mail_url}/faults").get("faults", [])
        if not any(fault.get("rcpt") == REFUSING_CONTACT for fault in faults):
            _http("POST", f"{self.run.mail_url}/faults", {"mode": "reject", "rcpt": REFUSING_CONTACT})

    def approve_waiting(self) -> None:
        """The scripted manager approves each plan that waits (four eyes: not the agent's owner)."""
        from harness.chaos.run import _db_retry

        with contextlib.suppress(OSError, urllib.error.URLError):
            self.refusal_ensure()

        for pk in _db_retry(lambda: list(self.workflows().filter(state=W.PROPOSED).values_list("pk", flat=True))) or []:
            with contextlib.suppress(PlanDecisionRefused):
                _db_retry(functools.partial(plan_decide, workflow_pk=pk, user=self.run.manager, decision="approve"))

    def settled(self) -> bool:
        """Every workflow proposed is final, or waits for a named person."""
        from harness.chaos.run import _db_retry

        def query() -> bool:
            moving = self.workflows().exclude(state__in=[W.COMPLETED, W.COMPENSATED, W.FAILED, W.REJECTED])
            waiting = moving.filter(state__in=list(WAITING_WITH_OWNER), owner__isnull=False)
            return self.workflows().count() >= self.proposed and moving.count() == waiting.count()

        return bool(_db_retry(query))

    # --- after the drain ---------------------------------------------------------------------

    def resolve_reviews(self, mail_ledger: list[Effect]) -> dict[str, int]:
        """The clerk for workflow emails held for a person: a message the relay's list shows is
        confirmed; one it does not show is recorded as failed (never sent again here), which lets
        the workflow compensate. The adjustments are resolved by the run's finance clerk."""
        from harness.chaos.run import _db_retry

        counts: dict[str, int] = {}
        sent = {effect.action_id for effect in mail_ledger}
        pending = _db_retry(
            lambda: list(
                self.children()
                .filter(status=S.NEEDS_REVIEW, kind="supplier_email")
                .select_related("owner")
                .order_by("pk")
            )
        )
        for action in pending or []:
            if action.owner is None:
                counts["left (no owner)"] = counts.get("left (no owner)", 0) + 1
                continue
            try:
                if action.action_id in sent:
                    action_resolve_succeeded(
                        action_pk=action.pk,
                        user=action.owner,
                        provider_reference=message_reference(action.action_id),
                        reason="Chaos run: the relay's list shows the message.",
                        evidence="relay list",
                    )
                    counts["confirmed"] = counts.get("confirmed", 0) + 1
                else:
                    action_resolve_failed(
                        action_pk=action.pk, user=action.owner, reason="Chaos run: the relay's list has no message."
                    )
                    counts["recorded failed"] = counts.get("recorded failed", 0) + 1
            except ReviewRefused as refused:
                counts[f"left ({refused.code})"] = counts.get(f"left ({refused.code})", 0) + 1
        return counts

    def wait_settled(self, deadline_seconds: float) -> bool:
        """After the clerk's resolutions: run each workflow's coordinator once here (a paused one
        resumes or compensates), then wait until the workers have taken them to rest."""
        import time

        from harness.chaos.run import _db_retry

        for workflow_id in _db_retry(lambda: list(self.workflows().values_list("workflow_id", flat=True))) or []:
            _db_retry(functools.partial(workflow_advance, workflow_id=workflow_id))

        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline:
            if self.settled():
                return True
            time.sleep(0.5)
        return self.settled()

    def audit(self, ledger: list[Effect], resolutions: dict[str, int]) -> dict[str, Any]:
        from harness.chaos.run import _db_retry

        return dict(_db_retry(lambda: self._audit(ledger, resolutions)))

    def _audit(self, ledger: list[Effect], resolutions: dict[str, int]) -> dict[str, Any]:
        effects: dict[str, int] = {}
        for effect in ledger:
            if effect.is_effect and effect.action_id and effect.action_id.startswith(self.prefix):
                effects[effect.action_id] = effects.get(effect.action_id, 0) + 1
        steps = list(
            WorkflowStep.objects.filter(workflow__workflow_id__startswith=self.prefix).select_related(
                "workflow", "action", "compensation"
            )
        )
        states: dict[str, int] = {}
        for state in self.workflows().values_list("state", flat=True):
            states[state] = states.get(state, 0) + 1
        duplicates = [key for key, count in effects.items() if count > 1 and not key.endswith(":compensate")]
        # Voids have no ledger of their own: a void confirmed more than once is two answers saying
        # "voided" to two sends (harmless for a set step, but counted).
        void_twice = list(
            Attempt.objects.filter(
                action__action_id__startswith=self.prefix,
                action__kind="credit-note-void",
                kind=AttemptKind.SUBMIT,
                outcome="succeeded",
            )
            .values_list("action__action_id", flat=True)
            .order_by()
        )
        twice = [key for key, count in effects.items() if count > 1 and key.endswith(":compensate")]
        twice += sorted({key for key in void_twice if void_twice.count(key) > 1})
        lost = [
            wf.workflow_id
            for wf in self.workflows()
            if wf.state not in (W.COMPLETED, W.COMPENSATED, W.REJECTED) and wf.owner_id is None
        ]
        while_unknown = []
        out_of_order = []
        by_workflow: dict[int, list[WorkflowStep]] = {}
        for step in steps:
            by_workflow.setdefault(step.workflow_id, []).append(step)
        for workflow_steps in by_workflow.values():
            workflow_steps.sort(key=lambda s: s.position)
            children = [s.action for s in workflow_steps if s.action is not None]
            for step in workflow_steps:
                comp = step.compensation
                if comp is None:
                    continue
                # Events are ordered by their id (insertion order): an event inserted after a
                # change was committed and seen has a higher id than that change's event.
                created = comp.events.filter(transition="propose").values_list("pk", flat=True).first()
                for child in children:
                    last = (
                        ActionEvent.objects.filter(action=child, pk__lte=created)
                        .order_by("-pk")
                        .values_list("to_state", flat=True)
                        .first()
                    )
                    if last in UNRESOLVED:
                        while_unknown.append(comp.action_id)
            for earlier, later in itertools.pairwise(workflow_steps):
                if later.action is None or earlier.action is None:
                    continue
                done = (
                    ActionEvent.objects.filter(action=earlier.action, to_state=S.SUCCEEDED)
                    .order_by("pk")
                    .values_list("pk", flat=True)
                    .first()
                )
                started = later.action.events.filter(transition="propose").values_list("pk", flat=True).first()
                if done is None or (started is not None and started < done):
                    out_of_order.append(later.action.action_id)
        compensations = sum(1 for s in steps if s.compensation is not None)
        children = self.children()
        kinds: dict[str, int] = {}
        for kind in children.values_list("kind", flat=True):
            kinds[kind] = kinds.get(kind, 0) + 1
        paused_events = WorkflowEvent.objects.filter(
            workflow__workflow_id__startswith=self.prefix, transition="pause"
        ).count()
        return {
            "proposed": self.proposed,
            "proposal_errors": self.errors,
            "states": states,
            "children": kinds,
            "compensations": compensations,
            "paused_at_some_point": paused_events,
            "duplicates": duplicates,
            "lost": lost,
            "compensations_twice": twice,
            "compensations_while_unknown": sorted(set(while_unknown)),
            "out_of_order": out_of_order,
            "resolutions": resolutions,
            "ok": not (duplicates or lost or twice or while_unknown or out_of_order),
        }


def workflow_report_lines(report: dict[str, Any], *, work: int) -> list[str]:
    if not report:
        return ["  workflows        none in this run"]
    share = 100.0 * report["proposed"] / max(work, 1)
    states = ", ".join(f"{k} {v}" for k, v in sorted(report["states"].items()))
    children = ", ".join(f"{k} {v}" for k, v in sorted(report["children"].items()))
    lines = [
        f"  workflows        {report['proposed']} po_mismatch_resolution proposed ({share:.1f}% of the run's work; "
        f"{report['proposal_errors']} proposal errors); {states}",
        f"    children       {children}; {report['compensations']} compensation(s) started; "
        f"{report['paused_at_some_point']} pause(s)",
        f"    duplicates {len(report['duplicates'])}, lost {len(report['lost'])}, compensations run twice "
        f"{len(report['compensations_twice'])}, compensations while an outcome was unknown "
        f"{len(report['compensations_while_unknown'])}, steps out of order {len(report['out_of_order'])} "
        "(all must be 0)",
        "    resolutions    " + (", ".join(f"{k} {v}" for k, v in sorted(report["resolutions"].items())) or "-"),
    ]
    for name in ("duplicates", "lost", "compensations_twice", "compensations_while_unknown", "out_of_order"):
        for item in report[name][:10]:
            lines.append(f"    [{name}] {item}")
    return lines


__all__ = ["WorkflowChaos", "workflow_report_lines"]
