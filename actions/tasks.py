"""Celery tasks: thin interfaces over actions.execution."""

from __future__ import annotations

from celery import shared_task


def dispatch_enqueue(action_pk: int) -> None:
    """Publish a dispatch for an authorized action. Called from transaction.on_commit."""
    dispatch.delay(action_pk)


@shared_task(name="actions.tasks.dispatch")
def dispatch(action_pk: int) -> str:
    from actions.execution import execution_dispatch

    return execution_dispatch(action_pk=action_pk)


@shared_task(name="actions.tasks.sweep_authorized")
def sweep_authorized() -> int:
    from actions.execution import sweep_authorized as sweep

    return sweep()


@shared_task(name="actions.tasks.sweep_expired_leases")
def sweep_expired_leases() -> int:
    from actions.execution import sweep_expired_leases as sweep

    return sweep()


@shared_task(name="actions.tasks.reconcile")
def reconcile(action_pk: int, published_mark: str | None = None) -> str:
    from datetime import datetime

    from actions.reconciliation import reconcile_action

    mark = datetime.fromisoformat(published_mark) if published_mark else None
    return reconcile_action(action_pk=action_pk, published_mark=mark)


@shared_task(name="actions.tasks.sweep_reconcile")
def sweep_reconcile() -> int:
    """Publish one reconcile task per due UNKNOWN or SETTLING action, once per lease.

    A task that finds its action no longer due (another reconciler claimed it) does nothing,
    so a message redelivered is harmless; a lost message is published again once its mark
    passes (actions.reconciliation.reconcile_publish_due).
    """
    from actions.reconciliation import reconcile_publish_due

    published = reconcile_publish_due()
    for pk, mark in published:
        reconcile.delay(pk, mark.isoformat())
    return len(published)


@shared_task(name="actions.tasks.ledger_audit")
def ledger_audit() -> int:
    from actions.audit import ledger_audit_run

    return ledger_audit_run().discrepancies_found


@shared_task(name="actions.tasks.housekeeping_prune_attempt_bodies")
def housekeeping_prune_attempt_bodies() -> int:
    from actions.housekeeping import attempts_prune_bodies

    return attempts_prune_bodies().pruned
