"""The periodic tasks go to a queue of their own, and every place that starts workers starts one
that consumes it: a queue nobody consumes would stop the sweeps without a single error.

The places are read as they are: the shell scripts behind `make start` and `make serve`, the
systemd units in console/deploy/, and the commands the chaos harness and the test suite's
WorkerPool build (recorded, not started).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from console.celery import app
from harness.chaos import run as chaos_run
from tests.processes import REPO_ROOT, WorkerPool

DEPLOY = REPO_ROOT / "console" / "deploy"


def required_queues() -> set[str]:
    """The workers' queue and every queue a task is routed to."""
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    return {settings.CELERY_TASK_DEFAULT_QUEUE, *routed}


def consumed_queues(command: list[str]) -> set[str]:
    """The queues a ``celery worker`` command consumes: its ``-Q``/``--queues``, else the default."""
    for position, argument in enumerate(command):
        if argument in ("-Q", "--queues"):
            return set(command[position + 1].split(","))
        if argument.startswith("--queues="):
            return set(argument.removeprefix("--queues=").split(","))
    return {settings.CELERY_TASK_DEFAULT_QUEUE}


def shell_worker_commands(*paths: Path) -> list[list[str]]:
    """Every ``celery ... worker`` command line in shell scripts or systemd units."""
    commands = []
    for path in paths:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.removeprefix("ExecStart=").strip()
            if line.startswith("#") or "celery" not in line:
                continue
            words = shlex.split(line, comments=True)
            if any(word.endswith("celery") for word in words) and "worker" in words and "beat" not in words:
                commands.append(words)
    return commands


class _Recorded:
    """Stands in for the chaos harness's Process: keeps the command, starts nothing."""

    commands: list[list[str]] = []

    def __init__(self, name: str, command: list[str], *args: Any, **kwargs: Any) -> None:
        self.name = name
        self.command = command
        self.host = kwargs.get("host", "")
        _Recorded.commands.append(command)


def chaos_worker_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """The Celery workers one host of the chaos run starts (the hosts mode starts the same per host)."""
    monkeypatch.setattr(chaos_run, "Process", _Recorded)
    monkeypatch.setattr(_Recorded, "commands", [])
    chaos = chaos_run.ChaosRun(chaos_run.ChaosConfig(workers=1, dispatchers=1), workdir=tmp_path)
    chaos.start_host_processes(chaos.hosts[0], with_faults=False)
    return [command for command in _Recorded.commands if "worker" in command and "celery" in command]


def pool_worker_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """The worker the test suite's WorkerPool starts, with and without beat."""
    pool = WorkerPool(tmp_path, "http://127.0.0.1:9", "redis://127.0.0.1:6379/15")
    commands: list[list[str]] = []
    monkeypatch.setattr(pool, "_launch", lambda name, command, **kwargs: commands.append(command))
    pool.start()
    pool.start(beat=True)
    return commands


def worker_commands(place: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    scripts = REPO_ROOT / "console" / "scripts"
    if place == "make start":
        return shell_worker_commands(scripts / "start.sh")
    if place == "make serve":
        return shell_worker_commands(scripts / "serve.sh")
    if place == "console/deploy systemd units":
        return shell_worker_commands(*sorted(DEPLOY.glob("*.service")))
    if place == "the chaos harness":
        return chaos_worker_commands(monkeypatch, tmp_path)
    return pool_worker_commands(monkeypatch, tmp_path)


def test_every_periodic_task_is_routed_to_the_periodic_queue_and_nothing_else_is() -> None:
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert app.amqp.router.route({}, entry["task"])["queue"].name == settings.PERIODIC_QUEUE, name
    for task in ("actions.tasks.dispatch", "actions.tasks.reconcile", "actions.tasks.workflow_advance"):
        assert app.amqp.router.route({}, task)["queue"].name == settings.CELERY_TASK_DEFAULT_QUEUE, task


@pytest.mark.parametrize(
    "place",
    ["make start", "make serve", "console/deploy systemd units", "the chaos harness", "the test suite's workers"],
)
def test_every_place_that_starts_workers_consumes_every_queue(
    place: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    commands = worker_commands(place, monkeypatch, tmp_path)
    assert commands, f"no celery worker command found for {place}"
    consumed = set().union(*(consumed_queues(command) for command in commands))
    missing = required_queues() - consumed
    assert not missing, f"{place} starts no worker for the queue(s) {sorted(missing)}: those tasks would never run"


@pytest.mark.parametrize("place", ["make start", "make serve", "console/deploy systemd units", "the chaos harness"])
def test_the_periodic_queue_has_a_worker_of_its_own_where_the_console_runs(
    place: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A worker that also took dispatches would run the sweeps only between them, behind whatever
    # backlog it was working through: the staleness the queue of their own is there to end.
    commands = worker_commands(place, monkeypatch, tmp_path)
    assert {settings.PERIODIC_QUEUE} in [consumed_queues(command) for command in commands], commands
