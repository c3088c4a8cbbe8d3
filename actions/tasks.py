"""Celery tasks: thin interfaces over the engine.

The services and the approval policy publish the dispatch by name (``actions.foundation.publish``), so
nothing below this module imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.utils import timezone

from actions.agents.webhooks import webhook_deliver, webhook_sweep_due
from actions.engine.dispatch import execution_dispatch
from actions.engine.housekeeping import attempts_prune_bodies
from actions.engine.ledger import ledger_audit_run
from actions.engine.reconcile import reconcile_action, reconcile_publish_due
from actions.engine.retention import retention_run
from actions.engine.sweeps import sweep_authorized as sweep_authorized_run
from actions.engine.sweeps import sweep_expired_leases as sweep_expired_leases_run
from actions.engine.throttle import dispatch_wait, reconcile_wait, republish_delay
from actions.evidence.checkpoints import checkpoint_make, signing_key
from actions.evidence.verify import trail_check
from actions.foundation.publish import queue_backlog
from actions.foundation.schedule import once_per_period
from actions.notifications import notifications_send_due
from actions.workflows.coordinator import sweep_workflows as sweep_workflows_run
from actions.workflows.coordinator import workflow_advance as workflow_advance_run
from approvals.services import rejection_commit as rejection_commit_run
from approvals.services import rejections_commit_due


def task(function: Callable[..., Any]) -> Task:
    """A Celery task named after its function in this module ("actions.tasks.dispatch"): the
    name the services publish and beat's entries send."""
    return shared_task(name=f"{__name__}.{function.__name__}")(function)


def periodic_task(function: Callable[..., Any]) -> Task:
    """A task that beat sends, run once per period: its beat entry is its name with dashes
    ("sweep-authorized")."""
    return task(once_per_period(function.__name__.replace("_", "-"))(function))


@task
def dispatch(action_pk: int) -> str:
    # The receiver's bucket is empty: the action stays AUTHORIZED (no claim, no lease) and its
    # dispatch is published again for when a token is due (actions.engine.throttle).
    wait = dispatch_wait(action_pk=action_pk)
    if wait > 0:
        dispatch.apply_async((action_pk,), countdown=republish_delay(wait))
        return "throttled"
    return execution_dispatch(action_pk=action_pk)


@periodic_task
def sweep_authorized() -> int:
    return sweep_authorized_run()


@periodic_task
def sweep_expired_leases() -> int:
    return sweep_expired_leases_run()


@task
def reconcile(action_pk: int, published_mark: str | None = None) -> str:
    mark = datetime.fromisoformat(published_mark) if published_mark else None
    # The lookup takes a token from its receiver's bucket first, as a dispatch does; while it
    # waits, the action keeps its published mark (no sweep publishes it again until the mark
    # passes) and this task comes back with the same mark.
    wait = reconcile_wait(action_pk=action_pk, now=timezone.now(), published_mark=mark)
    if wait > 0:
        reconcile.apply_async((action_pk, published_mark), countdown=republish_delay(wait))
        return "throttled"
    return reconcile_action(action_pk=action_pk, published_mark=mark)


@periodic_task
def sweep_reconcile() -> int:
    """Publish one reconcile task per due UNKNOWN or SETTLING action, once per lease.

    A task that finds its action no longer due (another reconciler claimed it) does nothing,
    so a message redelivered is harmless; a lost message is published again once its mark
    passes (actions.engine.reconcile.reconcile_publish_due).
    """
    # Backpressure: while the queue is deep, the reconcile messages already in it are waiting
    # their turn. Publishing more would only add duplicates behind them every lease (the
    # 10,000-action chaos run saw 130,000 messages queued, nine in ten of them reconciliations
    # of the same few hundred actions, and its drain stalled). The due actions keep their due
    # time and are published once the queue is short again; a message lost meanwhile is covered
    # the same way.
    backlog = queue_backlog()
    if backlog is not None and backlog > settings.RECONCILE_PUBLISH_MAX_BACKLOG:
        return 0
    published = reconcile_publish_due()
    for pk, mark in published:
        reconcile.delay(pk, mark.isoformat())
    return len(published)


@periodic_task
def ledger_audit() -> int:
    return ledger_audit_run().discrepancies_found


@periodic_task
def housekeeping_prune_attempt_bodies() -> int:
    return attempts_prune_bodies().pruned


@periodic_task
def retention_archive() -> int:
    """The number of audit events archived (docs/operators/retention.md)."""
    return retention_run().archived.events


@task
def rejection_commit(action_pk: int) -> bool:
    """A pending rejection's undo window has passed: commit it (a no-op if it was undone)."""
    return rejection_commit_run(action_pk=action_pk) is not None


@periodic_task
def sweep_rejections() -> int:
    return rejections_commit_due()


@task
def deliver_agent_webhook(delivery_pk: int) -> str:
    return webhook_deliver(delivery_pk)


@periodic_task
def sweep_agent_webhooks() -> int:
    return len(webhook_sweep_due())


@periodic_task
def notify_people() -> int:
    return notifications_send_due().sent


@periodic_task
def trail_checkpoint() -> int | None:
    made = checkpoint_make().checkpoint
    return made.number if made is not None else None


@periodic_task
def trail_verify() -> int:
    """The number of breaks found (finance is told of each)."""
    return len(trail_check(key=signing_key()).breaks)


@task
def workflow_advance(workflow_id: str) -> str:
    return workflow_advance_run(workflow_id=workflow_id)


@periodic_task
def sweep_workflows() -> int:
    """Advance workflows whose next move was never made (a nudge lost, a worker killed)."""
    return sweep_workflows_run()
