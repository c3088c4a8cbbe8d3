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
def reconcile(action_pk: int) -> str:
    from actions.reconciliation import reconcile_action

    return reconcile_action(action_pk=action_pk)


@shared_task(name="actions.tasks.sweep_reconcile")
def sweep_reconcile() -> int:
    """Publish one reconcile task per due UNKNOWN or SETTLING action.

    A task that finds its action no longer due (another reconciler claimed it) does nothing,
    so a message published twice, or redelivered, is harmless; a lost message is published
    again by the next sweep because the action is still due.
    """
    from actions.reconciliation import reconcile_due

    due = reconcile_due()
    for pk in due:
        reconcile.delay(pk)
    return len(due)


@shared_task(name="actions.tasks.ledger_audit")
def ledger_audit() -> int:
    from actions.audit import ledger_audit_run

    return ledger_audit_run().discrepancies_found
