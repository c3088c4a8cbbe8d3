"""Invalid characters in path and query parameters answer exactly like any unknown value.

PostgreSQL's text columns cannot hold NUL, so a NUL byte that reached a query used to crash
the request (a 500). Every path and query parameter of every operation is taken from the
served OpenAPI document, so an operation added later is covered without editing this file.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client

from tests.api.conftest import ApiClient

pytestmark = pytest.mark.django_db

# Percent-encoded as they travel in a URL: NUL alone, NUL inside a plausible value, other
# control characters, a byte that is not UTF-8, and an encoded lone surrogate (also not UTF-8).
INVALID_VALUES = ["%00", "unknown%00value", "unknown%01%1F%7Fvalue", "unknown%FFvalue", "unknown%ED%A0%80value"]
# A value of the right shape that names nothing: the answer every invalid value must match.
UNKNOWN_VALUE = "unknown-value"


def _parameters() -> list[tuple[str, str, str, str]]:
    """(method, path, location, name) of every path and query parameter in the document."""
    document = json.loads(Client().get("/api/v1/openapi.json").content)
    found = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] in ("path", "query"):
                    found.append((method, path, parameter["in"], parameter["name"]))
    return found


PARAMETERS = _parameters()


def _url(path: str, location: str, name: str, value: str) -> str:
    # Other path parameters get the plain unknown value, so only one parameter varies.
    filled = path
    for segment in [part[1:-1] for part in path.split("/") if part.startswith("{")]:
        filled = filled.replace("{" + segment + "}", value if (location, segment) == ("path", name) else UNKNOWN_VALUE)
    if location == "query":
        filled += f"?{quote(name)}={value}"
    return filled


def _comparable(response: Any) -> dict[str, Any]:
    """What a client can tell apart: status, code and the fields named, not the path echoed."""
    body = response.json()
    return {
        "status": response.status_code,
        "content_type": response["Content-Type"],
        "code": body.get("code"),
        "errors": sorted((error["field"], error["code"]) for error in body.get("errors", [])),
        "detail": body.get("detail") if response.status_code == 404 else None,
    }


def test_the_document_has_the_parameters_this_test_is_about() -> None:
    names = {(location, name) for _, _, location, name in PARAMETERS}
    assert {("path", "action_id"), ("query", "status"), ("query", "cursor"), ("query", "limit")} <= names


@pytest.mark.parametrize(("method", "path", "location", "name"), PARAMETERS)
@pytest.mark.parametrize("invalid", INVALID_VALUES)
def test_an_invalid_character_answers_like_an_unknown_value(
    api: ApiClient, method: str, path: str, location: str, name: str, invalid: str
) -> None:
    send = getattr(api.client, method)
    headers = api.headers()

    unknown = send(_url(path, location, name, UNKNOWN_VALUE), headers=headers)
    response = send(_url(path, location, name, invalid), headers=headers)

    assert response.status_code < 500, response.content
    assert _comparable(response) == _comparable(unknown)
    if location == "path":
        # Not even the body may tell an invalid id from an unknown one.
        assert response.content == unknown.content


def test_a_nul_in_an_action_id_is_the_same_404_as_an_unknown_id(api: ApiClient) -> None:
    unknown = api.get("/api/v1/actions/refund-order")
    response = api.get("/api/v1/actions/refund%00order")

    assert response.status_code == 404
    assert response.content == unknown.content


def test_a_nul_in_a_repeated_status_is_refused_like_an_unknown_status(api: ApiClient) -> None:
    unknown = api.client.get("/api/v1/actions?status=PROPOSED&status=PROPOSEDX", headers=api.headers())
    response = api.client.get("/api/v1/actions?status=PROPOSED&status=PRO%00POSED", headers=api.headers())

    assert response.status_code == 422
    assert _comparable(response) == _comparable(unknown)
