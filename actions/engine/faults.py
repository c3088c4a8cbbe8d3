"""Named fault points: a test or the chaos run kills a real worker at an exact instant."""

from __future__ import annotations

import logging
import os
import random
import signal

log = logging.getLogger(__name__)

FAULT_POINTS = (
    "before_provider_call",
    "after_provider_answer",
    "during_reconciliation",
    "after_record",
    "during_invalidation",
    # The workflow coordinator's (actions.workflows.coordinator).
    "workflow_before_next_step",
    "workflow_after_next_step",
    "workflow_during_compensation",
)


def fault_point(name: str) -> None:
    """Kill this process here if the fault point is switched on; inert otherwise.

    Read from the environment at every call (not from settings at import), so a test can start
    a worker with ``CONSOLE_FAULT_POINTS=after_provider_answer`` and a fresh worker without it.
    ``name@0.1`` kills with probability 0.1 (the chaos run).
    """
    raw = os.environ.get("CONSOLE_FAULT_POINTS", "")
    if not raw:
        return
    for entry in raw.split(","):
        point, _, probability = entry.strip().partition("@")
        if point != name:
            continue
        if probability and random.random() >= float(probability):
            continue
        log.warning("fault point %s: killing worker process %s", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
