"""The crash matrix for supplier emails: a real worker SIGKILLed in each window, crossed with
three SMTP outcomes, audited against the mail sandbox's own list of messages.

Windows: before the relay call; after the relay answered, before recording; during
reconciliation (the action is first left unrecorded, then the reconciler dies); after recording,
before the ack. Outcomes: 250; 451 before DATA once (then 250); the message stored and the
connection dropped before the reply.

Email has no key and no lookup, so a worker lost with the send in flight cannot be recovered
by asking: the action must end with a named person (NEEDS_REVIEW), never with a second message.
Every message is sent at most once, except after a person's recorded "send again".
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from actions.engine.resolutions import action_resolve_resend
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import Action, ActionStatus
from approvals.models import Decision
from approvals.services import approval_decide
from tests.mail import BILL_PARAMETERS, MailSandboxClient
from tests.processes import WorkerPool, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WINDOWS = ["before_provider_call", "after_provider_answer", "during_reconciliation", "after_record"]
OUTCOMES = ["250", "451_before_data_once", "drop_after_data"]
FINAL = {ActionStatus.SUCCEEDED, ActionStatus.FAILED_FINAL, ActionStatus.NEEDS_REVIEW}


@pytest.fixture
def fast_policy(settings: Any) -> None:
    settings.LEASE_SECONDS = 3
    settings.SWEEP_INTERVAL_SECONDS = 1
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.RECONCILE_BASE_BACKOFF_SECONDS = 1
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0


@pytest.fixture
def mail_workers(workers: WorkerPool, mail_sandbox: MailSandboxClient) -> WorkerPool:
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


def _wait_dead(worker: Any) -> None:
    wait_until(lambda: not worker.alive, timeout=30, what=f"worker {worker.name} to die at its fault point")
    assert worker.process.returncode == -9, f"the worker exited with {worker.process.returncode}, not SIGKILL"


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("window", WINDOWS)
def test_a_worker_killed_in_any_window_sends_each_email_at_most_once(
    window: str,
    outcome: str,
    mail_workers: WorkerPool,
    mail_sandbox: MailSandboxClient,
    supplier: Any,
    agent_actor: Any,
    manager: Any,
    finance: Any,
    fast_policy: None,
) -> None:
    """Invariants 1, 3, 8 and 16: whatever window the worker dies in and whatever the relay
    answered, the action ends succeeded, failed or with a named person, the sandbox holds at
    most one message for it, and audit_effects passes; a person's "send again" is the only way
    to a second message, marked as a possible repeat."""
    if outcome == "451_before_data_once":
        mail_sandbox.fault(mode="defer", count=1)
    elif outcome == "drop_after_data":
        mail_sandbox.fault(mode="drop_after_data", count=1)

    first = mail_workers.start(fault_points="after_provider_answer" if window == "during_reconciliation" else window)
    action = supplier_email_propose(
        supplier="ACME",
        reference=f"bill-{window[:12]}-{outcome[:4]}",
        template="bill_adjusted",
        parameters=BILL_PARAMETERS,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)

    _wait_dead(first)
    if window == "during_reconciliation":
        reconciler = mail_workers.start(fault_points="during_reconciliation", beat=True)
        _wait_dead(reconciler)

    mail_workers.start(beat=True)
    final = wait_until(
        lambda: Action.objects.filter(pk=action.pk, status__in=FINAL).first(),
        timeout=60,
        what=f"the email to drain after a kill {window} with {outcome}",
    )

    messages = mail_sandbox.messages(action.action_id)
    assert len(messages) <= 1, f"{len(messages)} messages without a person's decision"
    if final.status == ActionStatus.SUCCEEDED:
        assert len(messages) == 1
    if final.status == ActionStatus.NEEDS_REVIEW:
        assert final.owner == finance and final.due_at is not None
    if outcome == "250" and window in ("after_provider_answer", "during_reconciliation"):
        # The relay took it, but the worker died before recording: only a person can say.
        assert final.status == ActionStatus.NEEDS_REVIEW and len(messages) == 1
    if outcome == "451_before_data_once" and window == "after_record":
        # The refusal was recorded: the action went back for another send and succeeded.
        assert final.status == ActionStatus.SUCCEEDED
    call_command("audit_effects")

    if final.status == ActionStatus.NEEDS_REVIEW:
        # Finance decides to send again: the second message is the recorded exception.
        action_resolve_resend(action_pk=action.pk, user=finance, reason="The supplier says nothing arrived.")
        # A relay that still refuses before DATA sends it back for another send under the
        # approval: the workers take it from there.
        wait_until(
            lambda: Action.objects.filter(pk=action.pk, status__in=FINAL).first(),
            timeout=60,
            what="the email sent again to be final",
        )
        after = mail_sandbox.messages(action.action_id)
        assert len(after) == len(messages) + 1
        assert after[-1]["possible_repeat"].startswith("yes")
        call_command("audit_effects")
