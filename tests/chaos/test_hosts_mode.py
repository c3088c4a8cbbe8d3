"""The chaos run's hosts mode without running it: how the report judges the sweeps after a host's
loss, the skewed clock, and the refusals before anything starts. The run itself is
test_small_chaos.py (CI) and ``manage.py chaos_run --hosts 2``."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from harness.chaos import hosts as hosts_mode
from harness.chaos.hosts import (
    Host,
    Sample,
    ScheduleSampler,
    hosts_report_lines,
    hosts_summary,
    measured_skew,
    skew_environment,
)
from harness.chaos.run import ChaosConfig, ChaosReport

SWEEPS = ("sweep-authorized", "sweep-expired-leases")


def sampler_with(ages_at: list[tuple[float, float | None]]) -> ScheduleSampler:
    """A sampler whose samples give every sweep the same age at each time."""
    sampler = ScheduleSampler(started=0.0)
    sampler.thresholds = dict.fromkeys(SWEEPS, 3.0) | {"ledger-audit": 3600.0}
    for at, age in ages_at:
        sampler.samples.append(
            Sample(
                at=at,
                ages=dict.fromkeys(SWEEPS, age),
                hosts=dict.fromkeys(SWEEPS, "b" if 10 <= at < 30 else "a"),
                periods={entry: f"period-{int(at)}" for entry in SWEEPS},
            )
        )
    return sampler


def summary_of(sampler: ScheduleSampler) -> dict[str, Any]:
    lost = Host(name="a", killed_at=10.0, back_at=30.0, processes_killed=4)
    return hosts_summary([lost, Host(name="b", skew_seconds=90)], sampler, interval=1.0, drain_at=50.0, ended_at=60.0)


def test_sweeps_within_their_threshold_after_the_takeover_pass() -> None:
    # At 10.5 s the dead host's last period is still the latest (4 s old): before the takeover
    # (one interval after the kill), so it does not count.
    summary = summary_of(sampler_with([(5.0, 1.0), (10.5, 4.0), (12.0, 2.9), (20.0, 1.5), (29.0, 3.0)]))
    assert summary["alone"] == dict.fromkeys(SWEEPS, 3.0)
    assert summary["sweeps_kept_running"]
    # Four samples from the kill to the return, each a new period of each sweep, claimed by b.
    assert summary["periods"]["a down"] == {"b": 4 * len(SWEEPS)}
    report = ChaosReport(config={}, hosts=summary)
    assert report.hosts_ok


def test_a_sweep_past_its_threshold_while_the_survivor_ran_alone_fails_the_run() -> None:
    summary = summary_of(sampler_with([(12.0, 2.0), (20.0, 3.4), (29.0, 1.0)]))
    assert summary["alone"] == dict.fromkeys(SWEEPS, 3.4)
    assert summary["alone_over_threshold"] == list(SWEEPS)
    assert not summary["sweeps_kept_running"]
    report = ChaosReport(config={}, hosts=summary)
    assert not report.hosts_ok
    assert any("OVER" in line for line in hosts_report_lines(summary) if "sweep-authorized" in line)


def test_a_sweep_that_never_finished_counts_as_stale() -> None:
    summary = summary_of(sampler_with([(12.0, None), (20.0, 1.0)]))
    assert summary["alone"] == dict.fromkeys(SWEEPS, None)
    assert not summary["sweeps_kept_running"]


def test_a_host_that_did_not_come_back_fails_the_run() -> None:
    sampler = sampler_with([(12.0, 1.0), (20.0, 1.0)])
    lost = Host(name="a", killed_at=10.0, back_at=None)
    summary = hosts_summary([lost, Host(name="b")], sampler, interval=1.0, drain_at=50.0, ended_at=60.0)
    assert summary["sweeps_kept_running"]
    assert not ChaosReport(config={}, hosts=summary).hosts_ok


def test_the_skew_applies_to_a_process_started_with_the_hosts_environment() -> None:
    # Needs Debian's libfaketime (console/scripts/test.sh installs it). The child also sleeps:
    # a preload that breaks time.sleep (libfaketime with an unfaked monotonic clock) fails here.
    for skew in (90, -90):
        assert abs(measured_skew({**os.environ, **skew_environment(skew)}) - skew) < 5
    assert skew_environment(0) == {}


def test_a_missing_libfaketime_is_refused_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAOS_LIBFAKETIME", raising=False)
    monkeypatch.setattr(hosts_mode, "LIBFAKETIME_PATTERN", "/nonexistent/*/libfaketime.so.1")
    with pytest.raises(RuntimeError, match=r"apt-get install -y faketime"):
        skew_environment(90)


def test_the_schedule_s_pid_is_told_apart_by_its_host(tmp_path: Any) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        env={**os.environ, hosts_mode.HOST_ENV: "b"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Once it prints, it runs the new program (its environment is no longer its parent's).
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        sampler = ScheduleSampler(started=0.0)
        assert sampler.host_of(f"vm:{child.pid}") == "b"
        assert sampler.host_of("vm:999999999") == "?"
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--skew-seconds", "90"], "need --hosts 2"),
        (["--lose-host-at", "0.4"], "need --hosts 2"),
        (["--hosts", "0"], "at least 1"),
        (["--periodic-concurrency", "0"], "the sweeps need a process"),
        (["--hosts", "2", "--lose-host-at", "1.5"], "below 1"),
        (["--hosts", "2", "--host-back-after", "0"], "above 0"),
    ],
)
def test_the_command_refuses_a_hosts_mode_it_cannot_run(arguments: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("chaos_run", *arguments)


def test_the_hosts_mode_is_off_by_default() -> None:
    config = ChaosConfig()
    assert (config.hosts, config.lose_host_at, config.skew_seconds) == (1, 0.0, 0)
