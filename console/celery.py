"""The Celery app: dispatch, reconciliation and sweep tasks run in worker processes."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["actions"])


@signals.task_prerun.connect
@signals.task_postrun.connect
def release_database_connections(sender: Any = None, **kwargs: Any) -> None:
    """Hand this thread's database connections back to the process's pool around each task.

    Django does the same around each request. With CONN_MAX_AGE = 0 (the pool requires it) a
    connection goes back to the pool, not to the server; one left unusable by an error is
    closed. In place of the Django fix-up's per-task close (settings.CELERY_DB_REUSE_MAX).
    An eager task runs inside its caller's transaction, which must stay open.
    """
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    close_old_connections()
