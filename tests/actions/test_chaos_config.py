"""The chaos run's configuration and report, without running it: the mix of kinds,
the PostgreSQL cluster the restart acts on, per-kind counts and the accounting ledger's audit.
The run itself is tests/chaos (CI) and ``manage.py chaos_run``."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from actions.engine.invariants import EffectsReport, check_effects
from actions.kinds.invoice_adjustment.contract import effect_from_credit_note
from actions.services import Actor
from harness.chaos import run as chaos
from harness.chaos.run import ChaosConfig, ChaosReport, postgres_restart_command
from tests.actions.test_admin_credit_note_void import credit_note, succeeded_adjustment
from tests.processes import wait_until


def test_by_default_at_least_a_third_of_the_actions_are_adjustments() -> None:
    config = ChaosConfig(actions=10_000)
    assert config.adjustments * 3 >= config.actions
    assert config.refunds + config.adjustments == config.actions
    assert ChaosConfig(actions=300, adjustment_share=0).adjustments == 0


@pytest.fixture
def clusters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for version, cluster in (("15", "main"), ("16", "main"), ("16", "chaos")):
        (tmp_path / version / cluster).mkdir(parents=True)
    monkeypatch.setattr(chaos, "POSTGRES_CONFIG_ROOT", tmp_path)
    yield tmp_path


def test_the_restart_acts_on_the_cluster_named_by_chaos_postgres_cluster(
    clusters: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHAOS_POSTGRES_CLUSTER", raising=False)
    assert postgres_restart_command() == ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart"]
    monkeypatch.setenv("CHAOS_POSTGRES_CLUSTER", "chaos")
    assert postgres_restart_command() == ["pg_ctlcluster", "--skip-systemctl-redirect", "16", "chaos", "restart"]


def test_an_unknown_cluster_is_refused_by_name_before_the_run_starts(
    clusters: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAOS_POSTGRES_CLUSTER", "nope")

    def must_not_run(self: Any) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(chaos.ChaosRun, "run", must_not_run)
    with pytest.raises(RuntimeError, match="CHAOS_POSTGRES_CLUSTER='nope'"):
        postgres_restart_command()
    with pytest.raises(CommandError, match="'nope'"):
        call_command("chaos_run", "--actions", "3")
    with pytest.raises(CommandError, match="--adjustment-share"):
        call_command("chaos_run", "--actions", "3", "--adjustment-share", "1.5")


def test_the_sweep_interval_reaches_the_runs_config_and_a_bad_one_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configs: list[ChaosConfig] = []

    def captured(self: Any) -> None:
        configs.append(self.config)
        raise RuntimeError("captured before anything started")

    monkeypatch.setattr(chaos.ChaosRun, "run", captured)
    # The command makes SIGTERM unwind its run; not this test process's.
    monkeypatch.setattr("signal.signal", lambda *args: None)
    with pytest.raises(CommandError, match="--sweep-interval must be at least 1 second"):
        call_command("chaos_run", "--actions", "3", "--sweep-interval", "0", "--no-postgres-restart")
    assert configs == []
    with pytest.raises(CommandError, match="captured before anything started"):
        call_command("chaos_run", "--actions", "3", "--sweep-interval", "2", "--no-postgres-restart")
    assert [config.sweep_interval_seconds for config in configs] == [2]


def test_the_report_fails_on_an_accounting_ledger_problem_and_gives_each_kind_its_line() -> None:
    audit = EffectsReport(
        checked_at="now",
        actions_by_kind={"refund": 6, "invoice-adjustment": 4, "supplier_email": 2},
        duplicates_by_kind={"refund": 0, "invoice-adjustment": 1, "supplier_email": 0},
        lost_by_kind={"refund": 2, "invoice-adjustment": 0, "supplier_email": 0},
    )
    report = ChaosReport(config=vars(ChaosConfig()).copy(), drained=True, audit=audit)
    assert report.ok
    assert report.per_kind() == [
        ("refunds", "refund", 0, 2),
        ("adjustments", "invoice-adjustment", 1, 0),
        ("supplier emails", "supplier_email", 0, 0),
    ]
    lines = "\n".join(report.lines())
    assert "adjustments         4 actions; duplicates 1, lost 0" in lines

    report.accounting_problems.append("invoice-adjustment:bill-X:adjustment-1: 2 live credit notes (a, b)")
    assert not report.ok
    assert "[accounting ledger] invoice-adjustment:bill-X:adjustment-1" in "\n".join(report.lines())


@pytest.mark.django_db
def test_the_audit_counts_duplicates_per_kind(
    agent_actor: Actor, manager: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.ACCOUNTING_API_BASE = "http://accounting.invalid"
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    action = succeeded_adjustment(agent_actor, manager)
    twice = [effect_from_credit_note(credit_note(action, ref)) for ref in (action.provider_reference, "cn-again")]

    report = check_effects(ledger=twice)

    assert report.duplicates == 1
    assert report.duplicates_by_kind["invoice-adjustment"] == 1
    assert report.duplicates_by_kind["refund"] == 0
    assert report.actions_by_kind == {"invoice-adjustment": 1}
    assert action.amount == Decimal("20.00")


def test_the_proposals_of_every_kind_are_spread_over_the_whole_run() -> None:
    """Not queued one kind after another: each kind must meet the kills, faults and outage."""
    mixed = chaos._interleave(["refund"] * 180, ["adjustment"] * 120)
    mixed = chaos._interleave(mixed, ["email"] * 40)
    assert sorted(mixed) == sorted(["refund"] * 180 + ["adjustment"] * 120 + ["email"] * 40)
    for third in (mixed[:113], mixed[113:226], mixed[226:]):
        assert {"refund", "adjustment", "email"} <= set(third)
        assert third.count("adjustment") >= 35


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis server of the test's own, on a free port (the chaos run restarts only such a one)."""
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(
        [
            *("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", str(port)),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        check=True,
        timeout=30,
    )
    url = f"redis://127.0.0.1:{port}/0"
    # --daemonize returns before the server listens: wait, with a deadline, until it answers.
    wait_until(lambda: _answers(url), timeout=30, what="the test's own Redis server to answer")
    yield url
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=30)


@pytest.mark.django_db
def test_the_redis_restart_drops_every_queued_message_and_comes_back(
    own_redis: str, settings: Any, tmp_path: Path
) -> None:
    """A Redis restart, not only a flush: the server stops without saving
    (connections drop, queued messages are gone) and answers again."""
    import redis

    settings.CELERY_BROKER_URL = own_redis
    client = redis.Redis.from_url(own_redis)
    client.lpush("celery", "a queued dispatch")
    before = client.info("server")["run_id"]
    run = chaos.ChaosRun(ChaosConfig(restart_redis=True), workdir=tmp_path)

    run.restart_redis()

    fresh = redis.Redis.from_url(own_redis)
    assert fresh.info("server")["run_id"] != before, "a new server process"
    assert fresh.llen("celery") == 0
    assert run.report.redis_restarts == 1
