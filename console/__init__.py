from __future__ import annotations

# Load the Celery app when Django starts, so @shared_task binds to it.
from console.celery import app as celery_app

__all__ = ["celery_app"]
