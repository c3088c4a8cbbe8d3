"""Child processes of the benchmarks, each in a session of its own (shared by the Celery workers
of bench_dispatch and the dispatcher processes of dispatcher_profile)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path


def sessions_stop(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process's session (a prefork pool's children too), SIGKILL what is left after 30 s."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def logs_tail(paths: Iterable[Path]) -> str:
    """The last 2,000 characters of each log that exists."""
    return "\n".join(path.read_text(errors="replace")[-2000:] for path in paths if path.exists())
