"""Publishing work to the Celery workers, by task name.

The approval policy, the services and the engine publish dispatches; the task module calls the
engine. Publishing by name (``send_task``) keeps the layers one-way: nothing below the tasks
imports them. Tests replace ``dispatch_enqueue`` to watch or drop publishes.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from console.celery import app

log = logging.getLogger(__name__)

DISPATCH_TASK = "actions.tasks.dispatch"
RECONCILE_TASK = "actions.tasks.reconcile"
REJECTION_COMMIT_TASK = "actions.tasks.rejection_commit"


def dispatch_enqueue(action_pk: int) -> None:
    """Publish a dispatch for an authorized action.

    Not with DISPATCH_PUBLISH off, the setting for a deployment that runs the dispatcher process
    (actions.engine.dispatcher): it finds AUTHORIZED actions in the table itself, and a message
    per action would only make a Celery worker race it for the claim. The AUTHORIZED sweep still
    sends whatever no dispatcher took.
    """
    if not settings.DISPATCH_PUBLISH:
        return
    app.send_task(DISPATCH_TASK, args=(action_pk,))


def dispatch_enqueue_on_commit(action_pk: int) -> None:
    """Publish once the authorization is committed; a publish lost between commit and broker is
    picked up by the AUTHORIZED sweep.
    """
    # The name is looked up at commit time, so a test's replacement is the one called.
    transaction.on_commit(lambda: dispatch_enqueue(action_pk))


def reconcile_enqueue_on_commit(action_pk: int) -> None:
    """Publish a reconciliation once the change that made the action due is committed; a publish
    lost on the way is picked up by the reconciliation sweep, which finds it due."""
    transaction.on_commit(lambda: app.send_task(RECONCILE_TASK, args=(action_pk, None)))


def rejection_commit_enqueue(action_pk: int, countdown: int) -> None:
    """Publish the commit of a pending rejection for the end of its undo window. A publish lost
    on the way is picked up by the pages and the beat, which commit every due rejection."""
    app.send_task(REJECTION_COMMIT_TASK, args=(action_pk,), countdown=countdown)


WORKFLOW_ADVANCE_TASK = "actions.tasks.workflow_advance"


def workflow_advance_enqueue(workflow_id: str) -> None:
    """Publish a nudge to a workflow's coordinator (actions.workflows.coordinator)."""
    app.send_task(WORKFLOW_ADVANCE_TASK, args=(workflow_id,))


def workflow_advance_enqueue_on_commit(workflow_id: str) -> None:
    """Once the change is committed, wake the workflow's coordinator; a nudge lost on the way is
    made up by the workflow sweep, which finds the workflow's next step due."""
    transaction.on_commit(lambda: workflow_advance_enqueue(workflow_id))


def queue_backlog(queue: str = "") -> int | None:
    """How many messages wait in the workers' queue (or ``queue``), or None if the broker cannot
    say or cannot be reached: the sweeps then behave as if the queue were empty."""
    try:
        with app.connection_for_read() as connection:
            # Declared, not only probed: the workers declare the same queue, and a passive probe
            # of an empty Redis queue (no key) would fail instead of answering 0.
            declared = connection.default_channel.queue_declare(queue=queue or settings.CELERY_TASK_DEFAULT_QUEUE)
            return int(declared.message_count)
    except Exception:
        log.warning("could not read the queue's length", exc_info=True)
        return None
