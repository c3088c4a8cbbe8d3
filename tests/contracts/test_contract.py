"""The published contract: the code against the committed snapshots, and the comparison's rules
on breaks planted in copies of the snapshots."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts import DECLARED_BREAKS, MCP_SNAPSHOT, OPENAPI_SNAPSHOT, update
from contracts.compare import Verdict, contract_verdict
from contracts.generate import dumps, mcp_tools, openapi_document

REFUND_REQUESTS = "/api/v1/refund-requests"


def _snapshots() -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(OPENAPI_SNAPSHOT.read_text()), json.loads(MCP_SNAPSHOT.read_text())


def _verdict(
    edit_openapi: Callable[[dict[str, Any]], None] | None = None,
    edit_mcp: Callable[[dict[str, Any]], None] | None = None,
    declared: list[dict[str, Any]] | None = None,
) -> Verdict:
    openapi, mcp = _snapshots()
    new_openapi, new_mcp = copy.deepcopy(openapi), copy.deepcopy(mcp)
    if edit_openapi:
        edit_openapi(new_openapi)
    if edit_mcp:
        edit_mcp(new_mcp)
    return contract_verdict(
        old_openapi=openapi, new_openapi=new_openapi, old_mcp=mcp, new_mcp=new_mcp, declared=declared or []
    )


def _schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = document["components"]["schemas"][name]
    return schema


def _keys(verdict: Verdict) -> list[str]:
    return [change.key for change in verdict.undeclared]


# --- the code against the snapshots ---------------------------------------------------------


def test_the_code_breaks_no_client_of_the_committed_contract() -> None:
    verdict = contract_verdict(
        old_openapi=json.loads(OPENAPI_SNAPSHOT.read_text()),
        new_openapi=openapi_document(),
        old_mcp=json.loads(MCP_SNAPSHOT.read_text()),
        new_mcp=mcp_tools(),
        declared=json.loads(DECLARED_BREAKS.read_text()),
    )
    assert verdict.ok, verdict.report()


def test_the_snapshots_are_in_the_one_format_update_writes() -> None:
    for path in (OPENAPI_SNAPSHOT, MCP_SNAPSHOT):
        assert path.read_text() == dumps(json.loads(path.read_text())), path.name


def test_every_declared_break_names_a_reason_and_a_version() -> None:
    for entry in json.loads(DECLARED_BREAKS.read_text()):
        assert entry["reason"].strip() and entry["version"].strip(), entry


# --- planted breaks: each must fail ---------------------------------------------------------


def test_a_removed_response_field_breaks() -> None:
    verdict = _verdict(lambda d: _schema(d, "RefundRequestOut")["properties"].pop("source"))
    assert f"openapi POST {REFUND_REQUESTS}: response 201.source: removed" in _keys(verdict)
    assert not verdict.ok


def test_a_removed_request_field_breaks() -> None:
    verdict = _verdict(lambda d: _schema(d, "RefundRequestOpen")["properties"].pop("note"))
    assert f"openapi POST {REFUND_REQUESTS}: request.note: removed" in _keys(verdict)


def test_a_new_required_request_field_breaks() -> None:
    def add_required(d: dict[str, Any]) -> None:
        schema = _schema(d, "RefundRequestOpen")
        schema["properties"]["channel"] = {"type": "string"}
        schema["required"].append("channel")

    assert f"openapi POST {REFUND_REQUESTS}: request.channel: added as required" in _keys(_verdict(add_required))


def test_an_optional_request_field_becoming_required_breaks() -> None:
    verdict = _verdict(lambda d: _schema(d, "RefundRequestOpen")["required"].append("note"))
    assert f"openapi POST {REFUND_REQUESTS}: request.note: became required" in _keys(verdict)


def test_a_narrowed_enum_breaks_every_operation_that_takes_it() -> None:
    verdict = _verdict(lambda d: _schema(d, "ReasonCode")["enum"].remove("goodwill"))
    keys = _keys(verdict)
    assert f'openapi POST {REFUND_REQUESTS}: request.reason_code: enum value "goodwill" removed' in keys
    assert 'openapi POST /api/v1/refunds: request.reason_code: enum value "goodwill" removed' in keys


def test_a_removed_path_breaks() -> None:
    verdict = _verdict(lambda d: d["paths"].pop("/api/v1/orders"))
    assert _keys(verdict) == ["openapi /api/v1/orders: path removed"]


def test_a_changed_type_breaks() -> None:
    def amount_as_number(d: dict[str, Any]) -> None:
        amount = _schema(d, "RefundProposal")["properties"]["amount"]
        amount["type"] = "number"
        del amount["pattern"], amount["maxLength"], amount["minLength"]

    assert "openapi POST /api/v1/refunds: request.amount: type changed from string to number" in _keys(
        _verdict(amount_as_number)
    )


def test_a_narrowed_pattern_or_limit_breaks() -> None:
    def tighter(d: dict[str, Any]) -> None:
        note = _schema(d, "RefundRequestOpen")["properties"]["note"]
        note["maxLength"] = 200
        note["pattern"] = "^[a-z ]*$"

    keys = _keys(_verdict(tighter))
    assert f"openapi POST {REFUND_REQUESTS}: request.note: maxLength changed from 2000 to 200" in keys
    assert f"openapi POST {REFUND_REQUESTS}: request.note: pattern '^[a-z ]*$' added" in keys


def test_a_removed_or_added_status_code_breaks() -> None:
    def statuses(d: dict[str, Any]) -> None:
        responses = d["paths"][REFUND_REQUESTS]["post"]["responses"]
        del responses["409"]
        responses["202"] = {"description": "Accepted."}

    keys = _keys(_verdict(statuses))
    assert f"openapi POST {REFUND_REQUESTS}: status 409 removed" in keys
    assert f"openapi POST {REFUND_REQUESTS}: status 202 added" in keys


def test_a_removed_mcp_tool_argument_breaks() -> None:
    verdict = _verdict(edit_mcp=lambda m: m["open_refund_request"]["inputSchema"]["properties"].pop("note"))
    assert _keys(verdict) == ["mcp open_refund_request: arguments.note: removed"]


def test_an_mcp_argument_becoming_required_breaks() -> None:
    verdict = _verdict(edit_mcp=lambda m: m["open_refund_request"]["inputSchema"]["required"].append("note"))
    assert _keys(verdict) == ["mcp open_refund_request: arguments.note: became required"]


def test_a_removed_mcp_tool_breaks() -> None:
    assert _keys(_verdict(edit_mcp=lambda m: m.pop("explain_action"))) == ["mcp explain_action: tool removed"]


# --- additive changes pass; declared breaks pass ---------------------------------------------


def test_an_added_optional_field_a_path_and_a_tool_pass() -> None:
    def add_openapi(d: dict[str, Any]) -> None:
        _schema(d, "RefundRequestOpen")["properties"]["channel"] = {"type": "string", "default": "chat"}
        _schema(d, "RefundRequestOut")["properties"]["channel"] = {"type": "string"}
        _schema(d, "ReasonCode")["enum"].append("price_match")
        d["paths"]["/api/v1/refund-requests/{number}"] = {"get": {"responses": {"200": {"description": "OK"}}}}

    def add_mcp(m: dict[str, Any]) -> None:
        m["open_refund_request"]["inputSchema"]["properties"]["channel"] = {"type": "string"}
        m["list_orders"] = {"inputSchema": {"type": "object", "properties": {}}}

    verdict = _verdict(add_openapi, add_mcp)
    assert verdict.ok, verdict.report()
    assert {c.severity for c in verdict.changes} == {"additive"}
    assert f"openapi POST {REFUND_REQUESTS}: request.channel: added" in [c.key for c in verdict.changes]


def test_a_declared_break_passes_and_an_undeclared_one_beside_it_does_not() -> None:
    def two_breaks(d: dict[str, Any]) -> None:
        _schema(d, "RefundRequestOpen")["required"].append("note")
        d["paths"].pop("/api/v1/orders")

    declared = [
        {
            "change": f"openapi POST {REFUND_REQUESTS}: request.note: became required",
            "reason": "planted",
            "version": "2099-01-01",
        }
    ]
    assert _keys(_verdict(two_breaks, declared=declared)) == ["openapi /api/v1/orders: path removed"]


def test_a_declared_break_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="reason"):
        _verdict(declared=[{"change": "x", "reason": " ", "version": "2026-12-01"}])


# --- the update command ---------------------------------------------------------------------


def _point_update_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, openapi: dict[str, Any]) -> Path:
    snapshot = tmp_path / "openapi-v1.json"
    snapshot.write_text(dumps(openapi))
    (tmp_path / "mcp-tools.json").write_text(MCP_SNAPSHOT.read_text())
    monkeypatch.setattr(update, "OPENAPI_SNAPSHOT", snapshot)
    monkeypatch.setattr(update, "MCP_SNAPSHOT", tmp_path / "mcp-tools.json")
    return snapshot


def test_update_rewrites_a_snapshot_behind_an_additive_change(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    older, _ = _snapshots()
    older["paths"].pop("/api/v1/workflows")  # the code added it since: additive
    snapshot = _point_update_at(monkeypatch, tmp_path, older)
    assert update.main() == 0
    assert snapshot.read_text() == OPENAPI_SNAPSHOT.read_text()


def test_update_writes_nothing_while_a_break_is_undeclared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    older, _ = _snapshots()
    _schema(older, "ReasonCode")["enum"].append("retired_code")  # the code dropped it since: breaking
    snapshot = _point_update_at(monkeypatch, tmp_path, older)
    before = snapshot.read_text()
    assert update.main() == 1
    assert snapshot.read_text() == before
