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
