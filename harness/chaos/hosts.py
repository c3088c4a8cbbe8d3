"""The chaos run's hosts mode: two (or more) simulated hosts on one PostgreSQL and one Redis.

Each host is its own set of processes: a web process, Celery workers, optional dispatchers, the
periodic tasks' worker and a ``celery beat`` of its own (every host runs beat:
actions.foundation.schedule). Midway through the run one whole host is SIGKILLed, every process
of it in the same instant, beat included, and it comes back later with every process restarted.
One host's clock is skewed for all its processes with Debian's libfaketime, so that anything a
host decides from its own clock shows.

While the run goes, a sampler reads the schedule's liveness (actions.foundation.schedule's
``liveness``) every second, and which host's process claimed each periodic task's latest
period, so that the report can say how long the sweeps waited once the survivor took over (one
interval after the kill: the period the dead host had claimed may be lost with it) and which
host ran them when.

Kept out of ``harness.chaos.run`` so that the run's own module only gains a few hook calls.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, connection

from actions.foundation.schedule import liveness
from actions.models import SchedulePeriod

if TYPE_CHECKING:
    from harness.chaos.run import Process

# Debian's package "faketime" (library package libfaketime) installs the library here; the
# multiarch directory varies with the machine, hence the pattern. CHAOS_LIBFAKETIME overrides.
LIBFAKETIME_PATTERN = "/usr/lib/*/faketime/libfaketime.so.1"
# The periodic tasks whose liveness the report judges: the sweeps that make the system durable
# (lost publishes, expired leases, due reconciliations, workflows, rejections, agent webhooks).
SWEEP_PREFIX = "sweep-"
# A host's processes carry their host's name, so that a pid recorded by the schedule
# (SchedulePeriod.host is "hostname:pid", the same machine name for every simulated host) can be
# told apart: the pid's environment names its host.
HOST_ENV = "CHAOS_HOST"


def libfaketime_path() -> str:
    """The libfaketime library to preload, or a RuntimeError that says how to install it."""
    override = os.environ.get("CHAOS_LIBFAKETIME", "").strip()
    if override:
        if not os.path.isfile(override):
            raise RuntimeError(f"CHAOS_LIBFAKETIME={override!r}: no such file")
        return override
    found = sorted(glob.glob(LIBFAKETIME_PATTERN))
    if not found:
        raise RuntimeError(
            "a skewed host clock (--skew-seconds) needs Debian's libfaketime, and no "
            f"{LIBFAKETIME_PATTERN} exists: install it (apt-get install -y faketime; "
            "console/scripts/test.sh does), point CHAOS_LIBFAKETIME at the library, or pass --skew-seconds 0"
        )
    return found[0]


def skew_environment(skew_seconds: int) -> dict[str, str]:
    """What a process needs in its environment to see its wall clock ``skew_seconds`` off.

    The wall clock (CLOCK_REALTIME: time.time(), datetime.now(), Django's timezone.now()) is off
    by the skew, as on a host whose NTP is off. The monotonic clock is shifted by the same
    constant, which changes no interval: timeouts, sleeps and Celery's timers run at their usual
    pace. It is not left alone (FAKETIME_DONT_FAKE_MONOTONIC=1) because Debian's libfaketime
    0.9.10 then fails every clock_nanosleep on the monotonic clock with EINVAL, and Python 3.11's
    time.sleep is one: celery beat and the dispatcher died at their first sleep.
    """
    if not skew_seconds:
        return {}
    library = libfaketime_path()
    preload = os.environ.get("LD_PRELOAD", "").strip()
    return {
        "LD_PRELOAD": f"{library} {preload}".strip(),
        "FAKETIME": f"{skew_seconds:+d}s",
    }


def measured_skew(environment: dict[str, str]) -> float:
    """The skew a process started with ``environment`` really sees: a Python child sleeps (a
    preload that breaks time.sleep fails here, not in the middle of the run) and prints its
    time.time(), compared with this process's own."""
    before = time.time()
    child = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.01); print(repr(time.time()))"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"a process with the skewed host's environment failed under libfaketime: {last}")
    output = child.stdout
    after = time.time()
    return float(output.strip()) - (before + after) / 2


@dataclass
class Host:
    """One simulated host: its processes and its history in the run."""

    name: str
    skew_seconds: int = 0
    web_port: int = 0
    web: Process | None = None
    beat: Process | None = None
    periodic: Process | None = None  # the worker that consumes the periodic tasks' queue
    up: bool = True
    killed_at: float | None = None  # seconds since the run began
    back_at: float | None = None
    processes_killed: int = 0
    measured_skew: float | None = None

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def own_processes(self) -> list[Process]:
        """The processes a host runs once, beside its workers and dispatchers."""
        return [process for process in (self.web, self.beat, self.periodic) if process is not None]


@dataclass
class Sample:
    at: float  # seconds since the run began
    ages: dict[str, float | None]
    hosts: dict[str, str]  # entry -> the simulated host whose process claimed its latest period
    periods: dict[str, str]  # entry -> its latest period's start, to count periods per host


@dataclass
class ScheduleSampler:
    """Reads the schedule's liveness once a second in a thread of its own (with its own database
    connection), until stopped."""

    started: float  # time.monotonic() when the run began
    every: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0  # samples missed because the database did not answer
    thresholds: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pids: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="schedule-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every):
                try:
                    self.sample()
                except (OperationalError, InterfaceError):
                    # PostgreSQL restarting: the gap shows as a missed sample, and the next one reconnects.
                    self.errors += 1
                    connection.close()
        finally:
            connection.close()

    def sample(self) -> None:
        rows = liveness()
        claimed = {
            task: (host, start.isoformat())
            for task, host, start in SchedulePeriod.objects.values_list("task", "host", "period_start")
        }
        at = time.monotonic() - self.started
        self.thresholds = {row.entry: row.threshold_seconds for row in rows}
        self.samples.append(
            Sample(
                at=at,
                ages={row.entry: row.age_seconds for row in rows},
                hosts={task: self.host_of(host) for task, (host, _start) in claimed.items()},
                periods={task: start for task, (_host, start) in claimed.items()},
            )
        )

    def host_of(self, recorded: str) -> str:
        """The simulated host of a "hostname:pid" the schedule recorded, from the pid's environment."""
        pid = recorded.rpartition(":")[2]
        if pid not in self._pids:
            name = "?"
            try:
                with open(f"/proc/{pid}/environ", "rb") as environ:
                    for item in environ.read().split(b"\0"):
                        if item.startswith(HOST_ENV.encode() + b"="):
                            name = item.split(b"=", 1)[1].decode()
            except OSError:
                pass  # the process is gone (killed with its host): left unknown, asked again next time
            if name == "?":
                return name
            self._pids[pid] = name
        return self._pids[pid]

    def sweeps(self) -> list[str]:
        return sorted(entry for entry in self.thresholds if entry.startswith(SWEEP_PREFIX))

    def largest_ages(self, start: float, end: float) -> dict[str, float | None]:
        """Per sweep, the largest age sampled in [start, end) seconds since the run began
        (None: it had never finished)."""
        largest: dict[str, float | None] = {}
        for sample in self.samples:
            if not start <= sample.at < end:
                continue
            for entry in self.sweeps():
                age = sample.ages.get(entry)
                known = largest.get(entry)
                # None (never finished) is the worst age there is, and stays.
                if entry not in largest or age is None or (known is not None and age > known):
                    largest[entry] = age
        return largest

    def periods_by_host(self, start: float, end: float) -> dict[str, int]:
        """The sweep periods seen claimed in [start, end), counted per host (sampled once a
        second, so a lower bound on the periods run)."""
        seen: set[tuple[str, str, str]] = set()
        for sample in self.samples:
            if start <= sample.at < end:
                for entry in self.sweeps():
                    if entry in sample.periods:
                        seen.add((entry, sample.periods[entry], sample.hosts.get(entry, "?")))
        counts: dict[str, int] = {}
        for _entry, _period, host in seen:
            counts[host] = counts.get(host, 0) + 1
        return counts

    def fresh(self) -> bool:
        """In the latest sample, every sweep finished within its stale threshold."""
        if not self.samples or not self.sweeps():
            return False
        latest = self.samples[-1]
        return all(
            (age := latest.ages.get(entry)) is not None and age <= self.thresholds[entry] for entry in self.sweeps()
        )

    def dump(self, path: str) -> None:
        """Every sample as JSON lines, for a closer look at a run."""
        import json

        with open(path, "w") as out:
            for sample in self.samples:
                out.write(json.dumps(vars(sample)) + "\n")

    def first_complete(self) -> float:
        """When every sweep had finished at least once (seconds since the run began)."""
        for sample in self.samples:
            if all(sample.ages.get(entry) is not None for entry in self.sweeps()):
                return sample.at
        return float("inf")

    def samples_in(self, start: float, end: float) -> int:
        return sum(1 for sample in self.samples if start <= sample.at < end)


def hosts_summary(
    hosts: list[Host], sampler: ScheduleSampler | None, *, interval: float, drain_at: float | None, ended_at: float
) -> dict[str, Any]:
    """The hosts' part of the report, as data: the timeline, the sweeps' largest ages after the
    takeover and which host ran them when."""
    lost = next((host for host in hosts if host.killed_at is not None), None)
    summary: dict[str, Any] = {
        "hosts": [
            {
                "name": host.name,
                "skew_seconds": host.skew_seconds,
                "measured_skew": host.measured_skew,
                "killed_at": host.killed_at,
                "back_at": host.back_at,
                "processes_killed": host.processes_killed,
            }
            for host in hosts
        ],
        "lost": lost.name if lost else None,
        "interval": interval,
    }
    if sampler is None:
        return summary
    summary["thresholds"] = {entry: sampler.thresholds[entry] for entry in sampler.sweeps()}
    summary["samples"] = len(sampler.samples)
    summary["sample_errors"] = sampler.errors
    if lost is None or lost.killed_at is None:
        return summary
    takeover = lost.killed_at + interval
    back = lost.back_at if lost.back_at is not None else ended_at
    storm_end = drain_at if drain_at is not None else ended_at
    summary["takeover_at"] = takeover
    # While the survivor ran alone: the claim of this report.
    summary["alone"] = sampler.largest_ages(takeover, back)
    summary["alone_samples"] = sampler.samples_in(takeover, back)
    # From the takeover until the drain (the drain swaps every worker for a clean one at once).
    summary["until_drain"] = sampler.largest_ages(takeover, storm_end)
    # From the first sample in which every sweep had finished once (the processes take a while to start).
    summary["whole_run"] = sampler.largest_ages(sampler.first_complete(), ended_at)
    summary["periods"] = {
        "before the loss": sampler.periods_by_host(0.0, lost.killed_at),
        f"{lost.name} down": sampler.periods_by_host(lost.killed_at, back),
        f"after {lost.name}'s return": sampler.periods_by_host(back, ended_at),
    }
    over = [entry for entry, age in summary["alone"].items() if age is None or age > summary["thresholds"][entry]]
    summary["alone_over_threshold"] = over
    summary["sweeps_kept_running"] = bool(summary["alone_samples"]) and not over
    return summary


def _age(age: float | None) -> str:
    return "never" if age is None else f"{age:.1f} s"


def hosts_report_lines(summary: dict[str, Any]) -> list[str]:
    if not summary or len(summary.get("hosts", [])) < 2:
        return []
    lines = []
    for host in summary["hosts"]:
        clock = "its clock right"
        if host["skew_seconds"]:
            measured = host["measured_skew"]
            clock = (
                f"its clock {host['skew_seconds']:+d} s (measured {measured:+.1f} s)"
                if measured is not None
                else (f"its clock {host['skew_seconds']:+d} s")
            )
        fate = "up all run"
        if host["killed_at"] is not None:
            back = f"back at {host['back_at']:.1f} s" if host["back_at"] is not None else "NOT back"
            fate = (
                f"SIGKILLed at {host['killed_at']:.1f} s ({host['processes_killed']} processes, beat included), {back}"
            )
        lines.append(f"  host {host['name']:<11} {clock}; {fate}")
    if "takeover_at" not in summary:
        lines.append("  schedule         no host was lost in this run")
        return lines
    lines.append(
        f"  schedule         sampled every 1 s ({summary['samples']} samples, {summary['sample_errors']} missed); "
        f"the survivor took over at {summary['takeover_at']:.1f} s (one interval, {summary['interval']:g} s, "
        "after the kill)"
    )
    lines.append(
        f"    largest age    while the survivor ran alone ({summary['alone_samples']} samples), per sweep "
        "(stale threshold):"
    )
    for entry, age in summary["alone"].items():
        threshold = summary["thresholds"][entry]
        mark = "ok" if age is not None and age <= threshold else "OVER"
        lines.append(
            f"      {entry:<22} {_age(age):>8} (threshold {threshold:g} s) {mark}; until the drain "
            f"{_age(summary['until_drain'].get(entry))}, whole run (once started) "
            f"{_age(summary['whole_run'].get(entry))}"
        )
    lines.append(f"    sweeps kept running after the takeover: {'yes' if summary['sweeps_kept_running'] else 'NO'}")
    for phase, counts in summary["periods"].items():
        shown = ", ".join(f"{host} {count}" for host, count in sorted(counts.items())) or "none seen"
        lines.append(f"    sweeps run by  {phase}: {shown} sweep period(s) seen claimed")
    return lines


def kill_host(processes: list[Process]) -> int:
    """SIGKILL every process group of a host in the same instant, then reap them."""
    live = [process for process in processes if process.alive]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
    for process in live:
        process.popen.wait(timeout=10)
    return len(live)


def round_robin(items: Callable[[], list[str]]) -> Callable[[], str]:
    """The next of ``items()`` on each call, thread-safe: a load balancer that does not know
    which host is down, so an agent's retry lands on the next host."""
    lock = threading.Lock()
    position = [0]

    def next_item() -> str:
        with lock:
            current = items()
            position[0] += 1
            return current[position[0] % len(current)]

    return next_item


__all__ = [
    "HOST_ENV",
    "Host",
    "ScheduleSampler",
    "hosts_report_lines",
    "hosts_summary",
    "kill_host",
    "libfaketime_path",
    "measured_skew",
    "round_robin",
    "skew_environment",
]
