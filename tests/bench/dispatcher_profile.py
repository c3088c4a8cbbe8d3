"""The dispatcher profile of the dispatch benchmark: ``manage.py dispatcher`` processes instead of a
Celery task per action (``python -m tests.bench.bench_dispatch --dispatchers 2 ...``).

The Celery workers still run beside them (they run the bare no-ops, as in every profile); the
dispatch and end-to-end phases are done by the dispatcher processes. Their completion cannot be
read from the broker (no message per action), so it is read from the database, through one
connection of this module's own; each reading is one autocommit transaction, which is counted
and subtracted from the commits per action.

To time the dispatch phase alone, the dispatcher processes are paused (SIGSTOP) while the
actions are proposed, and resumed (SIGCONT) when the clock starts: the same N authorized
actions waiting, then drained, as the Celery profile's N held-back messages.

Run as ``python -m tests.bench.dispatcher_profile --concurrency C --batch B``, this module is the
dispatcher process itself: the benchmark's statement counter installed, then the management
command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.bench.sessions import logs_tail, sessions_stop

REPO_ROOT = Path(__file__).resolve().parents[2]
READY = "dispatcher ready"
PROFILE_ENV = "BENCH_PROFILE_DIR"


class Dispatchers:
    """``--dispatchers`` dispatcher processes with the benchmark's settings."""

    def __init__(self, *, count: int, concurrency: int, batch: int, workdir: Path, env: dict[str, str]) -> None:
        self.log_paths: list[Path] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        environment = {**env, "DISPATCH_PUBLISH": "0", "DATABASE_POOL_MAX": str(concurrency + 2)}
        for index in range(count):
            log_path = workdir / f"dispatcher-{index}-{uuid.uuid4().hex[:6]}.log"
            command = [
                sys.executable,
                "-m",
                "tests.bench.dispatcher_profile",
                "--concurrency",
                str(concurrency),
                "--batch",
                str(batch),
            ]
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    env=environment,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.log_paths.append(log_path)
            self.processes.append(process)
        deadline = time.monotonic() + 60
        while not all(READY in path.read_text(errors="replace") for path in self.log_paths):
            if not self.alive or time.monotonic() > deadline:
                raise RuntimeError(f"a dispatcher did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    @property
    def alive(self) -> bool:
        return all(process.poll() is None for process in self.processes)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    def stop(self) -> None:
        self.resume()
        sessions_stop(self.processes)

    def log_tail(self) -> str:
        return logs_tail(self.log_paths)


class Completion:
    """Reads whether the benchmark's actions are final, through a connection of its own; every
    reading is one commit, counted in ``readings`` so the benchmark can subtract them.

    It polls the number of live actions (AUTHORIZED to NEEDS_REVIEW), which PostgreSQL answers
    from the partial index ``action_live_idx``: a few hundred microseconds, however many finished
    actions the run has piled up. It polled, every 5 ms, the count of SUCCEEDED actions of the
    phase's orders, a join over every action and every order (``number LIKE``), which took 7 ms at
    20,000 actions: the measuring kept a PostgreSQL backend busy on this 2-core machine, and more
    so with each repetition. Each phase waits only once every action it measures is in the
    database (proposed before the wait starts), so no live action means the phase is over; the
    count of SUCCEEDED among its orders is then read once, and anything short of all of them is
    an error.
    """

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        import psycopg

        self._connection = psycopg.connect(
            dbname=settings_dict["NAME"],
            user=settings_dict.get("USER") or None,
            password=settings_dict.get("PASSWORD") or None,
            host=settings_dict.get("HOST") or None,
            port=settings_dict.get("PORT") or None,
            autocommit=True,
        )
        self.readings = 0

    def _count(self, query: Any, params: list[Any]) -> int:
        self.readings += 1
        row = self._connection.execute(query, params).fetchone()
        assert row is not None
        return int(row[0])

    def live(self) -> int:
        from psycopg import sql

        from actions.models.actions import LIVE_INDEX_STATUSES

        # The statuses of action_live_idx's condition as literals, so the planner can use it.
        statuses = sql.SQL(", ").join(sql.Literal(status) for status in LIVE_INDEX_STATUSES)
        return self._count(sql.SQL("SELECT count(*) FROM actions_action WHERE status IN ({})").format(statuses), [])

    def succeeded(self, prefix: str) -> int:
        return self._count(
            "SELECT count(*) FROM actions_action a JOIN actions_order o ON o.id = a.order_id "
            "WHERE o.number LIKE %s AND a.status = 'SUCCEEDED'",
            [f"{prefix}-%"],
        )

    def wait(
        self, prefix: str, count: int, *, dispatchers: Dispatchers, timeout: float = 600.0, stall: float = 60.0
    ) -> float:
        """Wait until no action is live, then check that the ``count`` actions of the orders named
        ``<prefix>-...`` SUCCEEDED; the moment it saw none live. Polled every 5 ms: fine-grained for
        the clock, cheap for PostgreSQL.

        Gives up, with the dispatchers' logs, when one died, when ``timeout`` has passed, when no
        action has left the live states for ``stall`` seconds (dispatchers that are alive but
        cannot do anything, with no database connection to be had, say, would otherwise hold the
        run for the whole timeout, phase after phase), or when the phase ended with fewer than
        ``count`` SUCCEEDED."""
        started = last_progress = time.monotonic()
        left = -1
        while (now_left := self.live()) > 0:
            now = time.monotonic()
            if now_left != left:
                left, last_progress = now_left, now
            if not dispatchers.alive:
                raise RuntimeError(f"a dispatcher died:\n{dispatchers.log_tail()}")
            if now - last_progress > stall:
                raise RuntimeError(
                    f"no action of {prefix} left the live states for {stall:.0f}s ({left} are live):\n"
                    f"{dispatchers.log_tail()}"
                )
            if now - started > timeout:
                raise RuntimeError(
                    f"the dispatchers did not drain {prefix} in {timeout:.0f}s:\n{dispatchers.log_tail()}"
                )
            time.sleep(0.005)
        finished = time.monotonic()
        if (done := self.succeeded(prefix)) != count:
            raise RuntimeError(
                f"{prefix} ended with {done} of {count} actions SUCCEEDED and none live:\n{dispatchers.log_tail()}"
            )
        return finished

    def close(self) -> None:
        self._connection.close()


def _count_statements_forever(directory: Path) -> None:
    """The benchmark's statement counter for a dispatcher process: every thread's statements,
    written to the counters folder every 20 ms (a dispatcher runs no Celery task whose end would
    write them)."""
    from django.db.backends.signals import connection_created

    counts: dict[int, int] = {}

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        ident = threading.get_ident()
        counts[ident] = counts.get(ident, 0) + 1
        return execute(sql, params, many, context)

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(on_connection, weak=False)
    descriptor = os.open(directory / f"statements-{os.getpid()}", os.O_WRONLY | os.O_CREAT, 0o644)

    def write() -> None:
        while True:
            os.pwrite(descriptor, f"{sum(counts.values()):20d}".encode(), 0)
            time.sleep(0.02)

    threading.Thread(target=write, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.dispatcher_profile")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()
    import django

    django.setup()
    if os.environ.get("BENCH_COUNTERS_DIR"):
        _count_statements_forever(Path(os.environ["BENCH_COUNTERS_DIR"]))
    from django.core.management import call_command

    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        call_command("dispatcher", concurrency=args.concurrency, batch=args.batch, idle=0.02)
        return
    # --profile-dispatchers: every thread's CPU time by function (yappi follows the pool threads,
    # which cProfile does not), written as a pstats file when the dispatcher stops. The profiler
    # slows the process several times over: read its shares, not its rates.
    import yappi  # tests/bench/requirements-bench.txt

    yappi.set_clock_type("cpu")
    yappi.start()
    try:
        call_command("dispatcher", concurrency=args.concurrency, batch=args.batch, idle=0.02)
    finally:
        yappi.stop()
        yappi.get_func_stats().save(str(Path(profile_dir) / f"dispatcher-{os.getpid()}.pstat"), type="pstat")


if __name__ == "__main__":
    main()
