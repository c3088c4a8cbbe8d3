"""MCP and HTTP cannot drift: each tool describes the same fields as its operation in
``/api/v1/openapi.json`` (names, types, constraints, defaults, required), in and out.

Words (titles, descriptions, examples) may differ; anything a client validates may not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import Client

from actions.mcp.server import mcp_server

# Words for people; everything else is the contract.
_WORDS = {"title", "description", "examples"}


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    """The schema with every local $ref replaced by its target and the words dropped."""
    if isinstance(schema, list):
        return [_resolve(item, root) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        return _resolve({**target, **siblings}, root)
    return {key: _resolve(value, root) for key, value in schema.items() if key not in _WORDS and key != "$defs"}


def _fields(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    resolved = _resolve(schema, root)
    required = set(resolved.get("required", []))
    properties = {}
    for name, field in resolved.get("properties", {}).items():
        # django-ninja leaves out a default of null; on an optional field it means the same.
        if name not in required and field.get("default", ...) is None:
            field = {key: value for key, value in field.items() if key != "default"}
        properties[name] = field
    return {
        "properties": properties,
        "required": sorted(resolved.get("required", [])),
        "additionalProperties": resolved.get("additionalProperties", True),
    }


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def tools() -> dict[str, Any]:
    listed = asyncio.run(mcp_server().list_tools())
    return {tool.name: tool for tool in listed}


def _operation(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    operation: dict[str, Any] = document["paths"][path][method]
    return operation


def _request_body(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return _operation(document, method, path)["requestBody"]["content"]["application/json"]["schema"]  # type: ignore[no-any-return]


def _answer(document: dict[str, Any], method: str, path: str, status: str = "200") -> dict[str, Any]:
    return _operation(document, method, path)["responses"][status]["content"]["application/json"]["schema"]  # type: ignore[no-any-return]


def _parameters(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """An operation's path and query parameters as one object schema."""
    properties: dict[str, Any] = {}
    required = []
    for parameter in _operation(document, method, path).get("parameters", []):
        properties[parameter["name"]] = parameter["schema"]
        if parameter.get("required"):
            required.append(parameter["name"])
    return {"type": "object", "properties": properties, "required": required}


@pytest.mark.parametrize(
    ("tool", "method", "path"),
    [
        ("propose_refund", "post", "/api/v1/refunds"),
        ("open_refund_request", "post", "/api/v1/refund-requests"),
        ("propose_invoice_adjustment", "post", "/api/v1/invoice-adjustments"),
        ("open_adjustment_request", "post", "/api/v1/adjustment-requests"),
    ],
)
def test_write_tools_take_the_fields_of_their_operation_body(
    tool: str, method: str, path: str, document: dict[str, Any], tools: dict[str, Any]
) -> None:
    schema = tools[tool].input_schema
    assert _fields(schema, schema) == _fields(_request_body(document, method, path), document)


@pytest.mark.parametrize(
    ("tool", "method", "path"),
    [("get_action", "get", "/api/v1/actions/{action_id}"), ("list_actions", "get", "/api/v1/actions")],
)
def test_read_tools_take_the_parameters_of_their_operation(
    tool: str, method: str, path: str, document: dict[str, Any], tools: dict[str, Any]
) -> None:
    schema = tools[tool].input_schema
    api = _fields(_parameters(document, method, path), document)
    mcp = _fields(schema, schema)
    assert mcp["properties"] == api["properties"]
    assert mcp["required"] == api["required"]
    # Tools refuse unknown arguments, as the API refuses unknown query parameters.
    assert mcp["additionalProperties"] is False


@pytest.mark.parametrize(
    ("tool", "method", "path", "status"),
    [
        ("propose_refund", "post", "/api/v1/refunds", "201"),
        ("propose_refund", "post", "/api/v1/refunds", "200"),
        ("propose_invoice_adjustment", "post", "/api/v1/invoice-adjustments", "201"),
        ("propose_invoice_adjustment", "post", "/api/v1/invoice-adjustments", "200"),
        ("get_action", "get", "/api/v1/actions/{action_id}", "200"),
    ],
)
def test_tools_answer_with_the_document_of_their_operation(
    tool: str, method: str, path: str, status: str, document: dict[str, Any], tools: dict[str, Any]
) -> None:
    schema = tools[tool].output_schema
    assert _fields(schema, schema) == _fields(_answer(document, method, path, status), document)


def test_the_listing_and_the_refund_request_answers_add_only_what_http_says_with_status_codes(
    document: dict[str, Any], tools: dict[str, Any]
) -> None:
    """HTTP says 'created' with 201 and 'next page' with a link; a tool says it in a field."""
    listing = tools["list_actions"].output_schema
    page = _fields(_answer(document, "get", "/api/v1/actions"), document)
    assert _fields(listing, listing)["properties"]["items"] == page["properties"]["items"]
    assert _fields(listing, listing)["properties"]["next_cursor"] == page["properties"]["next_cursor"]

    opened = tools["open_refund_request"].output_schema
    request = _fields(_answer(document, "post", "/api/v1/refund-requests", "201"), document)
    mcp = _fields(opened, opened)
    assert {name: mcp["properties"][name] for name in request["properties"]} == request["properties"]
    assert set(mcp["properties"]) - set(request["properties"]) == {"created"}

    opened = tools["open_adjustment_request"].output_schema
    request = _fields(_answer(document, "post", "/api/v1/adjustment-requests", "201"), document)
    mcp = _fields(opened, opened)
    assert {name: mcp["properties"][name] for name in request["properties"]} == request["properties"]
    assert set(mcp["properties"]) - set(request["properties"]) == {"created"}


def test_explain_action_explains_with_the_apis_explanation(document: dict[str, Any], tools: dict[str, Any]) -> None:
    explained = tools["explain_action"].output_schema
    action = _fields(_answer(document, "get", "/api/v1/actions/{action_id}"), document)
    mcp = _fields(explained, explained)
    for name in ("action_id", "status", "explanation"):
        assert mcp["properties"][name] == action["properties"][name], name
