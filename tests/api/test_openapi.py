"""The OpenAPI document and the docs page: valid, complete, and self-contained."""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from actions.api.problems import KINDS
from actions.api.schemas import ActionStatusName
from actions.models import ActionStatus, ReasonCode

# The document and the docs page serve the contract rather than belong to it; "api-root" and
# "not-found" only answer 404 problems for URLs that are not in the contract.
NOT_OPERATIONS = {"openapi-json", "openapi-view", "api-root", "not-found"}


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in the document: {keys}"
    return dict(pairs)


@pytest.fixture
def document() -> dict[str, Any]:
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = json.loads(response.content, object_pairs_hook=_refuse_duplicate_keys)
    return body


def test_the_served_document_is_a_valid_openapi_3_1_document(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    errors = [f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in OPENAPI_31_VALIDATOR.iter_errors(document)]
    assert errors == []


def _api_patterns() -> list[tuple[str, str | None]]:
    """(OpenAPI-style path, URL name) of every URL pattern mounted under api/v1/."""
    found = []
    for entry in get_resolver().url_patterns:
        if isinstance(entry, URLResolver) and str(entry.pattern) == "api/v1/":
            for pattern in entry.url_patterns:
                assert isinstance(pattern, URLPattern)
                route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
                found.append((f"/api/v1/{route}", pattern.name))
    return found


def test_every_api_url_in_the_urlconf_is_in_the_document(document: dict[str, Any]) -> None:
    patterns = _api_patterns()
    assert len(patterns) >= 6, "the API is not mounted at api/v1/"
    operations = {path for path, name in patterns if name not in NOT_OPERATIONS}
    assert operations == set(document["paths"])
    assert operations == {
        "/api/v1/refunds",
        "/api/v1/refund-requests",
        "/api/v1/supplier-emails",
        "/api/v1/adjustment-requests",
        "/api/v1/invoice-adjustments",
        "/api/v1/orders",
        "/api/v1/actions",
        "/api/v1/actions/{action_id}",
        "/api/v1/workflows",
        "/api/v1/workflows/{workflow_id}",
    }


def test_every_operation_declares_the_gateways_answers_as_problem_documents(document: dict[str, Any]) -> None:
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            assert {"401", "403", "429"} <= set(responses), (method, path)
            assert "Retry-After" in responses["429"]["headers"]
            if method == "post":
                assert {"400", "413", "415", "422"} <= set(responses), (method, path)
            for status, response in responses.items():
                if int(status) >= 400:
                    assert list(response["content"]) == ["application/problem+json"], (method, path, status)
            assert operation["security"] == [{"AgentBearer": []}]


def test_the_documented_choices_follow_the_models(document: dict[str, Any]) -> None:
    assert set(get_args(ActionStatusName)) == set(ActionStatus.values) - {ActionStatus.NEW}
    schemas = document["components"]["schemas"]
    assert schemas["ReasonCode"]["enum"] == ReasonCode.values
    assert set(schemas["RefundProposal"]["required"]) == {"order_number", "amount", "currency", "reason_code"}
    assert schemas["RefundProposal"]["additionalProperties"] is False


def test_the_docs_page_loads_nothing_from_elsewhere() -> None:
    response = Client().get("/api/v1/docs")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in response["Content-Security-Policy"]
    html = response.content.decode()
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html


def test_the_docs_page_documents_every_operation_and_problem(document: dict[str, Any]) -> None:
    html = Client().get("/api/v1/docs").content.decode()
    for path in document["paths"]:
        assert path in html
    for slug in KINDS:
        assert f'id="problem-{slug}"' in html
    assert 'href="/api/v1/openapi.json"' in html
