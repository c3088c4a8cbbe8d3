"""The sandbox in-process: its SQLite ledger survives restarts, and stale requests store nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from harness.sandboxes.payment import Request, Sandbox, SandboxConfig
from harness.sandboxes.payment.__main__ import build_parser
from tests.providers.sandbox_client import API_KEY, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _create(sandbox: Sandbox, key: str, amount: int = 100) -> Any:
    body = urlencode({"charge": "ch_1", "amount": amount, "metadata[action_id]": key}).encode()
    return sandbox.handle(Request("POST", "/v1/refunds", headers={**AUTH, "Idempotency-Key": key}, body=body))


def _control(sandbox: Sandbox, method: str, name: str, body: dict[str, Any] | None = None) -> Any:
    response = sandbox.handle(Request(method, f"/_sandbox/{name}", body=json.dumps(body or {}).encode()))
    assert response.status == 200, response.body
    return response.body


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "sandbox.sqlite3")


@pytest.fixture
def sandbox(db_path: str) -> Iterator[Sandbox]:
    instance = Sandbox(db_path)
    _control(instance, "POST", "charges", {"id": "ch_1", "amount": 5000, "currency": "eur"})
    yield instance
    instance.close()


def test_refunds_and_keys_survive_a_restart(sandbox: Sandbox, db_path: str) -> None:
    created = _create(sandbox, "refund:1").body
    sandbox.close()
    reopened = Sandbox(db_path)
    try:
        replay = _create(reopened, "refund:1")
        assert replay.body == created
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert [r["id"] for r in _control(reopened, "GET", "ledger")["data"]] == [created["id"]]
    finally:
        reopened.close()


def test_a_restart_releases_keys_whose_request_never_committed(sandbox: Sandbox, db_path: str) -> None:
    _create(sandbox, "refund:lost")
    with sandbox._tx() as db:  # the state a process killed before its commit leaves behind
        db.execute("DELETE FROM refunds")
        db.execute("UPDATE idempotency_keys SET state = 'in_flight', status_code = NULL, body = NULL")
    assert _create(sandbox, "refund:lost").status == 409
    sandbox.close()
    reopened = Sandbox(db_path)
    try:
        assert _create(reopened, "refund:lost").status == 200
    finally:
        reopened.close()


def test_a_restart_finishes_keys_whose_refund_was_committed(sandbox: Sandbox, db_path: str) -> None:
    _control(sandbox, "POST", "faults", {"mode": "commit_then_timeout", "sleep_seconds": 0})
    created = _create(sandbox, "refund:committed").body
    with sandbox._tx() as db:  # as if the process died during the sleep
        db.execute("UPDATE idempotency_keys SET state = 'in_flight'")
    sandbox.close()
    reopened = Sandbox(db_path)
    try:
        assert _create(reopened, "refund:committed").body == created
    finally:
        reopened.close()


def test_a_request_sleeping_through_a_reset_stores_nothing(sandbox: Sandbox) -> None:
    _control(sandbox, "POST", "faults", {"mode": "slow", "sleep_seconds": 0.5})
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(_create(sandbox, "refund:stale")))
    thread.start()
    wait_for(
        lambda: _control(sandbox, "GET", "faults")["fired"].get("create:slow") == 1,
        what="the slow request",
    )
    _control(sandbox, "POST", "reset")
    _control(sandbox, "POST", "charges", {"id": "ch_1", "amount": 5000, "currency": "eur"})
    thread.join()
    assert answers[0].status == 500
    assert _control(sandbox, "GET", "ledger")["data"] == []
    assert _create(sandbox, "refund:stale").status == 200


def test_the_command_line_reads_its_defaults_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_PORT", "12999")
    monkeypatch.setenv("SANDBOX_DB", "/tmp/elsewhere.sqlite3")
    monkeypatch.setenv("SANDBOX_KEY_RETENTION_SECONDS", "90")
    monkeypatch.setenv("SANDBOX_FAULT_SEED", "7")
    args = build_parser().parse_args([])
    assert (args.port, args.db, args.key_retention_seconds, args.fault_seed) == (
        12999,
        "/tmp/elsewhere.sqlite3",
        90.0,
        7,
    )
    assert build_parser().parse_args(["--port", "1"]).port == 1


def test_config_defaults_match_stripes_key_retention() -> None:
    assert SandboxConfig().key_retention_seconds == 24 * 3600
    with pytest.raises(ValueError):
        SandboxConfig().update({"pending_outcome": "maybe"})


def test_settling_what_is_due_reads_the_pending_refunds_index_not_the_whole_ledger(sandbox: Sandbox) -> None:
    """Every sandbox transaction first settles what is due; as a scan of every refund ever made,
    under the sandbox's one lock, it made the sandbox slower with each benchmark repetition. The
    statements are the ones the sandbox really sends (traced), each explained by SQLite."""
    sent: list[str] = []
    sandbox._db.set_trace_callback(sent.append)
    try:
        for number in range(3):
            assert _create(sandbox, f"settle-plan-{number}").status == 200
    finally:
        sandbox._db.set_trace_callback(None)
    settling = sorted({sql for sql in sent if "settle_at <=" in sql})
    assert settling, "no statement settled what was due"
    for sql in settling:
        plan = " ".join(str(step[-1]) for step in sandbox._db.execute("EXPLAIN QUERY PLAN " + sql).fetchall())
        assert "USING INDEX refunds_pending_settle" in plan, (sql, plan)
        assert "SCAN refunds" not in plan, (sql, plan)
