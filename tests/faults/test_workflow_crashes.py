"""Workflows under crashes: real Celery workers SIGKILLed at fault points, audited against the
sandboxes' own ledgers (the accounting sandbox's credit notes, the mail sandbox's messages).

- A kill between step k's record and step k+1's claim, for every k: a chain of workers each
  started with the fault point, each dying at the next step boundary, until the workflow is
  final. Exactly one effect per step.
- A kill in the middle of compensation: each compensation still runs once.
- Two workers on one workflow: one run.
- A step failing for good (the relay refuses the email, a sandbox fault): the credit note is
  voided, once. A step left UNKNOWN (the relay drops the connection after DATA) pauses the
  workflow with a named owner and compensates nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from actions.foundation.publish import workflow_advance_enqueue
from actions.foundation.trail import Actor
from actions.models import Action, ActionStatus, Supplier, SupplierContact, Workflow, WorkflowEvent, WorkflowState
from actions.workflows.services import plan_decide, workflow_propose
from tests.factories import make_bill
from tests.mail import MailSandboxClient
from tests.processes import Worker, WorkerPool, wait_until
from tests.providers.accounting_client import AccountingSandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]
W = WorkflowState
S = ActionStatus
SETTLED = {W.COMPLETED, W.COMPENSATED, W.FAILED, W.PAUSED}


@pytest.fixture
def fast_policy(settings: Any, live_accounting: Any, mail_sandbox: Any) -> None:
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.ACCOUNTING_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    settings.ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


@pytest.fixture
def pool(workers: WorkerPool, mail_sandbox: MailSandboxClient, fast_policy: None) -> WorkerPool:
    workers.extra_env.update(
        {
            "EMAIL_BACKEND": "actions.providers.mail.backend.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(mail_sandbox.smtp_port),
            "EMAIL_TIMEOUT": "1",
            "MAIL_SANDBOX_URL": mail_sandbox.url,
        }
    )
    return workers


def _plan(live_accounting: AccountingSandboxClient, agent_actor: Actor, manager: Any) -> Workflow:
    bill = make_bill(amount="200.00")
    live_accounting.seed_invoice(
        invoice_id=bill.accounting_reference, number=bill.number, total="200.00", Contact=bill.supplier_name
    )
    supplier, _ = Supplier.objects.get_or_create(code="ACME", defaults={"name": "Acme Widgets"})
    SupplierContact.objects.get_or_create(supplier=supplier, email="ap@acme.example")
    workflow = workflow_propose(
        template="po_mismatch_resolution",
        parameters={
            "bill_number": bill.number,
            "case": "case-1",
            "amount": "20.00",
            "currency": "EUR",
            "reason_code": "price_mismatch",
            "supplier": "ACME",
            "to": "ap@acme.example",
            "explanation": "Unit price above the purchase order.",
        },
        proposer=agent_actor,
    ).workflow
    # The approval's nudge is published on commit, to the test's broker: the workers take it.
    return plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve")


def _settled(workflow: Workflow, timeout: float = 90) -> Workflow:
    return wait_until(
        lambda: Workflow.objects.filter(pk=workflow.pk, state__in=SETTLED).first(),
        timeout=timeout,
        what=f"workflow {workflow.workflow_id} to settle",
    )


def _chain(pool: WorkerPool, workflow: Workflow, fault: str, *, most: int = 6) -> list[Worker]:
    """Workers started with ``fault`` one after the other, each after the previous one died,
    until the workflow settles: each dies at the next step boundary the fault point guards."""
    dead: list[Worker] = []
    for _ in range(most):
        worker = pool.start(fault_points=fault, beat=True)

        def dead_or_settled(worker: Worker = worker) -> bool:
            return not worker.alive or Workflow.objects.filter(pk=workflow.pk, state__in=SETTLED).exists()

        wait_until(
            dead_or_settled,
            timeout=60,
            what=f"a kill at {fault} or the workflow to settle",
        )
        if worker.alive:
            break
        assert worker.process.returncode == -9
        dead.append(worker)
    return dead


def _audit_one_effect_per_step(
    workflow: Workflow, live_accounting: AccountingSandboxClient, mail_sandbox: MailSandboxClient
) -> None:
    """Invariant 12, against the sandboxes' own ledgers: one credit note and one message."""
    post = f"{workflow.workflow_id}:post_credit_note"
    notes = [note for note in live_accounting.ledger() if note["Reference"] == post]
    assert len(notes) == 1, notes
    assert Action.objects.get(action_id=post).provider_reference == notes[0]["CreditNoteID"]
    email = f"{workflow.workflow_id}:email_supplier"
    assert len(mail_sandbox.messages(email)) == 1
    assert mail_sandbox.messages(f"{email}:compensate") == []
    call_command("audit_effects")


@pytest.mark.parametrize("fault", ["after_record", "workflow_after_next_step"])
def test_a_kill_at_every_step_boundary_gives_exactly_one_effect_per_step(
    fault: str,
    pool: WorkerPool,
    live_accounting: AccountingSandboxClient,
    mail_sandbox: MailSandboxClient,
    agent_actor: Actor,
    manager: Any,
) -> None:
    """Invariant 12: "Each workflow step causes at most one effect, and a step starts only after
    the step before it is recorded as SUCCEEDED." A worker dies at each boundary in turn."""
    workflow = _plan(live_accounting, agent_actor, manager)
    dead = _chain(pool, workflow, fault)
    assert len(dead) >= 2, "a kill at each of the two effect-step boundaries"
    pool.start(beat=True)
    final = _settled(workflow)
    assert final.state == W.COMPLETED, final.waiting_for
    _audit_one_effect_per_step(workflow, live_accounting, mail_sandbox)


def test_a_kill_before_the_next_step_is_created_is_recovered_by_the_sweep(
    pool: WorkerPool,
    live_accounting: AccountingSandboxClient,
    mail_sandbox: MailSandboxClient,
    agent_actor: Actor,
    manager: Any,
) -> None:
    workflow = _plan(live_accounting, agent_actor, manager)
    first = pool.start(fault_points="workflow_before_next_step", beat=True)
    wait_until(lambda: not first.alive, timeout=60, what="the kill before the next step")
    pool.start(beat=True)
    assert _settled(workflow).state == W.COMPLETED
    _audit_one_effect_per_step(workflow, live_accounting, mail_sandbox)


@pytest.mark.parametrize("fault", ["after_record", "workflow_during_compensation"])
def test_a_final_failure_voids_the_credit_note_once_even_with_a_kill_mid_compensation(
    fault: str,
    pool: WorkerPool,
    live_accounting: AccountingSandboxClient,
    mail_sandbox: MailSandboxClient,
    agent_actor: Actor,
    manager: Any,
) -> None:
    """Invariant 13: the relay refuses the supplier email for good (a sandbox fault); the credit
    note posted before it is voided, exactly once, with its own key, although a worker dies in
    the middle of the compensation."""
    mail_sandbox.fault(mode="reject", count=1)
    workflow = _plan(live_accounting, agent_actor, manager)
    if fault == "after_record":
        _chain(pool, workflow, fault)
    else:
        # Dies as it is about to create the compensation's child; the kill rolls that back, and
        # the next worker (the sweep) starts it again under the same key.
        victim = pool.start(fault_points=fault, beat=True)
        wait_until(lambda: not victim.alive, timeout=90, what="the kill mid-compensation")
    pool.start(beat=True)
    final = _settled(workflow)
    assert final.state == W.COMPENSATED, final.waiting_for
    post = f"{workflow.workflow_id}:post_credit_note"
    [note] = [note for note in live_accounting.ledger() if note["Reference"] == post]
    assert note["Status"] == "VOIDED"
    void = Action.objects.get(action_id=f"{post}:compensate")
    assert void.status == S.SUCCEEDED and void.payload["credit_note"] == note["CreditNoteID"]
    assert Action.objects.filter(action_id__endswith=":compensate").count() == 1
    assert mail_sandbox.messages(f"{workflow.workflow_id}:email_supplier") == []
    call_command("audit_effects")


def test_an_unknown_step_pauses_the_workflow_and_compensates_nothing(
    pool: WorkerPool,
    live_accounting: AccountingSandboxClient,
    mail_sandbox: MailSandboxClient,
    agent_actor: Actor,
    manager: Any,
    finance: Any,
) -> None:
    """Invariants 14 and 16: the relay drops the connection after DATA; the email's outcome is
    unknown and the relay cannot be asked, so it goes to a named person, the workflow pauses,
    and the credit note is not voided."""
    mail_sandbox.fault(mode="drop_after_data", count=1)
    workflow = _plan(live_accounting, agent_actor, manager)
    pool.start(beat=True)
    final = _settled(workflow)
    assert final.state == W.PAUSED and final.owner_id is not None
    email = Action.objects.get(action_id=f"{workflow.workflow_id}:email_supplier")
    assert email.status == S.NEEDS_REVIEW and email.owner_id == final.owner_id
    assert not Action.objects.filter(action_id__endswith=":compensate").exists()
    post = f"{workflow.workflow_id}:post_credit_note"
    # The credit note stands (allocated to the bill: AUTHORISED or PAID), not voided.
    [note] = [n for n in live_accounting.ledger() if n["Reference"] == post]
    assert note["Status"] in ("AUTHORISED", "PAID")


def test_two_workers_on_one_workflow_give_one_run(
    pool: WorkerPool,
    live_accounting: AccountingSandboxClient,
    mail_sandbox: MailSandboxClient,
    agent_actor: Actor,
    manager: Any,
) -> None:
    workflow = _plan(live_accounting, agent_actor, manager)
    # Duplicate nudges, as a redelivery would make, with two workers and two beats sweeping.
    for _ in range(4):
        workflow_advance_enqueue(workflow.workflow_id)
    pool.start(beat=True)
    pool.start(beat=True)
    assert _settled(workflow).state == W.COMPLETED
    _audit_one_effect_per_step(workflow, live_accounting, mail_sandbox)
    started = WorkflowEvent.objects.filter(workflow=workflow, transition="step_started").count()
    assert started == 2
