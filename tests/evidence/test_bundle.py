"""Evidence bundles: exported per action, read by finance and admins only, and checked by the
standalone verifier (tools/verify_evidence.py) with no database (docs/evidence.md)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.test import Client

from actions.evidence.checkpoints import checkpoint_make
from actions.foundation import sql
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent
from actions.services import Actor
from tests.evidence.test_trail_chain import cancelled_refund
from tests.factories import PASSWORD, make_order, make_request
from tools import verify_evidence

pytestmark = pytest.mark.postgres
KEY = "a-test-key-of-enough-length-0123456789"
VERIFIER = Path(django_settings.BASE_DIR) / "tools" / "verify_evidence.py"


@pytest.fixture(autouse=True)
def trail_settings(settings: Any, tmp_path: Path) -> None:
    settings.TRAIL_SIGNING_KEY = KEY
    settings.TRAIL_CHECKPOINT_LOG = tmp_path / "checkpoints.jsonl"




def checkpoint_after_commits() -> None:
    newest = ActionEvent.objects.order_by("-txid").values_list("txid", flat=True).first() or 0
    deadline = time.monotonic() + 60
    while (sql.transactions_ended_below() or 0) <= newest:
        assert time.monotonic() < deadline, "a transaction of another session stayed open for a minute"
        time.sleep(0.2)
    assert checkpoint_make().checkpoint is not None


def export(action: Action, out: Path) -> Path:
    call_command("export_evidence", "--action", action.action_id, "--out", str(out), stdout=io.StringIO())
    return out / (action.action_id.replace(":", "_") + ".json")


def check(path: Path, *extra: str) -> int:
    return verify_evidence.main([str(path), "--key", KEY, *extra])


@pytest.mark.django_db(transaction=True)
def test_a_bundle_verifies_without_the_console_and_one_changed_byte_fails_it(
    agent_actor: Actor, tmp_path: Path
) -> None:
    action = cancelled_refund(agent_actor)
    checkpoint_after_commits()
    path = export(action, tmp_path / "out")
    bundle = json.loads(path.read_bytes())
    assert [e["content"]["sequence"] for e in bundle["events"]] == [1, 2, 3]
    assert all(e["merkle"] and e["merkle"]["checkpoint"] == 1 for e in bundle["events"])
    assert bundle["approvals"][0]["payload_hash"] == action.payload_hash
    assert (path.with_suffix(".html")).read_text().count("not yet covered") == 0

    # In a fresh interpreter, isolated (-I: no site packages, no project path), with no database.
    env = {"PATH": os.environ.get("PATH", ""), "TRAIL_SIGNING_KEY": KEY}
    run = subprocess.run(
        [sys.executable, "-I", str(VERIFIER), str(path), "--require-checkpoint"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 events chained, 3 proven under 1 checkpoint(s)" in run.stdout

    original = path.read_bytes()
    # One byte in each part: an event's reason, a chain hash, the payload, an attempt-free
    # part (the target's money), the checkpoint's root and its signature.
    for needle in (
        b"not needed",
        bundle["events"][1]["chain_hash"].encode(),
        b'"10.00"',
        b"captured_amount",
        bundle["checkpoints"][0]["root"].encode(),
        bundle["checkpoints"][0]["signature"].encode(),
    ):
        at = original.index(needle) + 1
        changed = original[:at] + bytes([original[at] ^ 0x01]) + original[at + 1 :]
        path.write_bytes(changed)
        assert check(path) == 1, needle
    # The same with no key: the signatures cannot be checked, the hashes still are.
    at = original.index(b"not needed") + 1
    path.write_bytes(original[:at] + bytes([original[at] ^ 0x01]) + original[at + 1 :])
    assert verify_evidence.main([str(path), "--key", ""]) == 1
    path.write_bytes(original)
    assert check(path) == 0
    assert verify_evidence.main([str(path), "--key", "another-key-0123456789012345678901"]) == 1


def test_a_bundle_before_any_checkpoint_verifies_its_chain_and_says_so(agent_actor: Actor, tmp_path: Path) -> None:
    action = cancelled_refund(agent_actor)
    path = export(action, tmp_path)
    assert check(path) == 0
    assert check(path, "--require-checkpoint") == 1


def test_finance_and_admins_download_the_bundle_and_others_are_refused(
    agent_actor: Actor, finance: Any, console_admin: Any, manager: Any
) -> None:
    action = cancelled_refund(agent_actor)
    url = f"/review/actions/{action.pk}/evidence"
    for user in (finance, console_admin):
        client = Client()
        client.login(username=user.get_username(), password=PASSWORD)
        page = client.get(url)
        assert page.status_code == 200 and action.action_id in page.content.decode()
        download = client.get(url + "?format=json")
        assert download.status_code == 200
        assert "attachment" in download["Content-Disposition"]
        assert json.loads(download.content)["action"]["action_id"] == action.action_id
    client = Client()
    client.login(username=manager.get_username(), password=PASSWORD)
    assert client.get(url + "?format=json").status_code == 403
    anonymous = Client().get(url)
    assert anonymous.status_code == 302
    finance_client = Client()
    finance_client.login(username=finance.get_username(), password=PASSWORD)
    assert finance_client.get("/review/actions/999999/evidence").status_code == 404


def test_export_refuses_bad_input_by_name(db: Any, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="--action: no action 'refund:nope'"):
        call_command("export_evidence", "--action", "refund:nope", "--out", str(tmp_path))
    with pytest.raises(CommandError, match="--from: 'yesterday' is not a date"):
        call_command("export_evidence", "--from", "yesterday", "--to", "2026-01-01", "--out", str(tmp_path))
    with pytest.raises(CommandError, match="either --action, or --from and --to"):
        call_command("export_evidence", "--out", str(tmp_path))
    assert not list(tmp_path.iterdir())


@pytest.mark.django_db
def test_without_a_signing_key_the_page_says_why_instead_of_failing(
    client: Client, finance: Any, agent_actor: Actor, settings: Any
) -> None:
    order = make_order()
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="40.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    settings.TRAIL_SIGNING_KEY = ""
    client.force_login(finance)
    response = client.get(f"/review/actions/{action.pk}/evidence")
    assert response.status_code == 503
    assert "TRAIL_SIGNING_KEY" in response.content.decode()
