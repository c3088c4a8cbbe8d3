"""The Python client (console_client) against the live agent API.

A requests transport adapter sends each request over HTTP to the console served by
pytest-django's live server, so the answers are the API's own, through its whole stack, and
injects the faults that matter: the answer lost after the console recorded the request (a read
timeout), a refused connection, a 503.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from requests.structures import CaseInsensitiveDict

from actions.models import Action, RefundRequest
from console_client import (
    BadInput,
    Conflict,
    ConsoleClient,
    NotAllowed,
    NotFound,
    OutcomeTimeout,
    RetryPolicy,
    Unavailable,
)

BASE = "http://console.test"


class ConsoleAdapter(BaseAdapter):
    """Serves requests from the Django app; ``faults`` are used up one per request."""

    def __init__(
        self,
        respond: Callable[[requests.PreparedRequest], requests.Response] | None = None,
        *,
        live_url: str = "",
    ) -> None:
        super().__init__()
        self.live_url = live_url
        self.http = HTTPAdapter()
        self.faults: list[str] = []
        self.sent: list[tuple[str, str]] = []
        self.respond = respond

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        assert request.method is not None
        self.sent.append((request.method, request.path_url))
        fault = self.faults.pop(0) if self.faults else None
        if fault == "refused":
            raise requests.ConnectionError("connection refused")
        if fault == "503":
            return _response(request, 503, b"", {"Retry-After": "2"})
        if self.respond is not None:
            return self.respond(request)
        assert self.live_url, "an adapter without a script forwards to the live server"
        forwarded = request.copy()
        forwarded.url = self.live_url + request.path_url
        answer = self.http.send(forwarded, timeout=30)
        if fault == "lost_answer":
            # The console recorded the request; the answer never reached the agent.
            raise requests.ReadTimeout("read timed out")
        return _response(request, answer.status_code, answer.content, dict(answer.headers))

    def close(self) -> None:
        self.http.close()


def _response(request: requests.PreparedRequest, status: int, content: bytes, headers: dict[str, str]) -> Any:
    response = requests.Response()
    response.status_code = status
    response._content = content
    response.headers = CaseInsensitiveDict(headers)
    response.encoding = "utf-8"
    response.url = request.url or ""
    response.request = request
    return response


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def adapter(live_server: Any, transactional_db: None) -> ConsoleAdapter:
    return ConsoleAdapter(live_url=live_server.url)


def _client(token: str, adapter: BaseAdapter, sleeps: list[float], **kwargs: Any) -> ConsoleClient:
    session = requests.Session()
    session.mount(BASE, adapter)
    return ConsoleClient(BASE, token, session=session, sleep=sleeps.append, **kwargs)


@pytest.fixture
def console(token: str, adapter: ConsoleAdapter, sleeps: list[float]) -> ConsoleClient:
    return _client(token, adapter, sleeps, retry=RetryPolicy(attempts=4, base_delay=1.0, jitter=0.0))


def _propose(console: ConsoleClient, proposal: dict[str, Any], **changes: Any) -> Any:
    arguments = {**proposal, **changes}
    return console.propose_refund(**arguments)


def test_a_proposal_whose_answer_was_lost_is_sent_again_and_makes_one_action(
    console: ConsoleClient, adapter: ConsoleAdapter, sleeps: list[float], proposal: dict[str, Any]
) -> None:
    """The first answer is lost after the console recorded the proposal, the second attempt
    cannot connect, the third gets a 503: the fourth returns the action the first created."""
    adapter.faults = ["lost_answer", "refused", "503"]
    action = _propose(console, proposal)
    assert action.action_id == "refund:order-4821:request-1"
    assert action.status == "PROPOSED"
    assert action.amount == Decimal("40.00")
    assert adapter.sent == [("POST", "/api/v1/refunds")] * 4
    assert Action.objects.count() == 1
    # Exponential backoff, then the console's Retry-After.
    assert sleeps == [1.0, 2.0, 2.0]


def test_it_gives_up_with_unavailable_after_its_attempts(
    console: ConsoleClient, adapter: ConsoleAdapter, sleeps: list[float], proposal: dict[str, Any]
) -> None:
    adapter.faults = ["lost_answer"] * 4
    with pytest.raises(Unavailable) as unavailable:
        _propose(console, proposal)
    assert unavailable.value.kind == "retryable"
    assert len(adapter.sent) == 4
    assert len(sleeps) == 3
    # Recorded once, whatever happened to the answers.
    assert Action.objects.count() == 1


def test_a_changed_proposal_raises_conflict_with_the_differing_fields_and_is_not_retried(
    console: ConsoleClient, adapter: ConsoleAdapter, sleeps: list[float], proposal: dict[str, Any]
) -> None:
    _propose(console, proposal)
    with pytest.raises(Conflict) as conflict:
        _propose(console, proposal, amount=Decimal("45.00"))
    error = conflict.value
    assert (error.status, error.code, error.kind) == (409, "payload_conflict", "needs_person")
    assert error.action_id == "refund:order-4821:request-1"
    assert error.differing == {"amount": {"existing": "40.00", "proposed": "45.00"}}
    assert len(adapter.sent) == 2
    assert sleeps == []
    assert Action.objects.get().amount == Decimal("40.00")


def test_bad_input_names_the_fields_and_is_not_retried(
    console: ConsoleClient, adapter: ConsoleAdapter, proposal: dict[str, Any]
) -> None:
    with pytest.raises(BadInput) as invalid:
        _propose(console, proposal, currency="EURO", reason_code="because")
    assert invalid.value.kind == "bad_input"
    assert {(e.field, e.code) for e in invalid.value.errors} == {
        ("currency", "too_long"),
        ("reason_code", "invalid_choice"),
    }
    assert len(adapter.sent) == 1
    with pytest.raises(TypeError):
        _propose(console, proposal, amount=40.0)
    assert not Action.objects.exists()


def test_unknown_ids_and_bad_tokens_are_typed(
    console: ConsoleClient, adapter: ConsoleAdapter, sleeps: list[float], db: Any
) -> None:
    with pytest.raises(NotFound) as missing:
        console.get_action("refund:order-1:request-1")
    assert missing.value.code == "action_not_found"
    with pytest.raises(NotAllowed) as refused:
        _client("ect_revoked-or-made-up", adapter, sleeps).get_action("refund:order-1:request-1")
    assert refused.value.status == 401


def test_a_refund_request_opened_twice_is_the_same_request(console: ConsoleClient, order: Any) -> None:
    first = console.open_refund_request(
        order_number=order.number, external_reference="ZD-2", reason_code="damaged", note="Second parcel."
    )
    again = console.open_refund_request(order_number=order.number, external_reference="ZD-2", reason_code="damaged")
    assert (first.created, again.created) == (True, False)
    assert first.request_number == again.request_number == 2
    assert RefundRequest.objects.filter(order=order).count() == 2  # request 1 came with the fixture
    action = console.propose_refund(
        order_number=order.number, external_reference="ZD-2", amount="10.00", currency="EUR", reason_code="damaged"
    )
    assert action.request_number == 2
    assert console.list_actions().items == [action]


# --- wait_for_outcome, against scripted states ------------------------------------------------


def _action_json(status: str, *, final: bool = False, needs_person: bool = False) -> dict[str, Any]:
    return {
        "action_id": "refund:order-4821:request-1",
        "kind": "refund",
        "status": status,
        "explanation": {
            "summary": f"It is {status}.",
            "next_step": "Wait.",
            "held_by": "someone",
            "final": final,
            "needs_person": needs_person,
        },
        "order_number": "4821",
        "request_number": 1,
        "external_reference": None,
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "provider_reference": None,
        "rejection_reasons": [],
        "created_at": "2026-12-01T10:00:00Z",
        "updated_at": "2026-12-01T10:00:00Z",
        "status_changed_at": None,
        "links": {},
    }


class Script:
    """Answers GET /actions/... with the next scripted state; the last one repeats."""

    def __init__(self, *states: dict[str, Any]) -> None:
        self.states = list(states)
        self.reads = 0

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        self.reads += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return _response(request, 200, json.dumps(state).encode(), {"Content-Type": "application/json"})


class FakeClock:
    def __init__(self, sleeps: list[float]) -> None:
        self.sleeps = sleeps

    def __call__(self) -> float:
        return sum(self.sleeps)


def test_wait_for_outcome_stops_when_a_person_is_needed(sleeps: list[float]) -> None:
    script = Script(
        _action_json("SUBMITTING"),
        _action_json("UNKNOWN"),
        _action_json("UNKNOWN"),
        _action_json("NEEDS_REVIEW", needs_person=True),
        _action_json("SUCCEEDED", final=True),
    )
    console = _client("ect_x", ConsoleAdapter(script), sleeps, clock=FakeClock(sleeps))
    action = console.wait_for_outcome("refund:order-4821:request-1", timeout=600, poll_interval=5)
    assert action.status == "NEEDS_REVIEW"
    assert action.needs_person and not action.final
    assert script.reads == 4
    assert sleeps == [5, 5, 5]


def test_wait_for_outcome_stops_on_a_final_state(sleeps: list[float]) -> None:
    script = Script(_action_json("AUTHORIZED"), _action_json("SUCCEEDED", final=True))
    console = _client("ect_x", ConsoleAdapter(script), sleeps, clock=FakeClock(sleeps))
    assert console.wait_for_outcome("refund:order-4821:request-1", timeout=60).status == "SUCCEEDED"


def test_wait_for_outcome_can_wait_through_a_managers_decision(sleeps: list[float]) -> None:
    script = Script(
        _action_json("PROPOSED", needs_person=True),
        _action_json("AUTHORIZED"),
        _action_json("SUCCEEDED", final=True),
    )
    console = _client("ect_x", ConsoleAdapter(script), sleeps, clock=FakeClock(sleeps))
    assert console.wait_for_outcome("refund:order-4821:request-1", timeout=60).status == "PROPOSED"
    script.states = [_action_json("PROPOSED", needs_person=True), _action_json("SUCCEEDED", final=True)]
    action = console.wait_for_outcome("refund:order-4821:request-1", timeout=60, wait_for_approval=True)
    assert action.status == "SUCCEEDED"


def test_wait_for_outcome_times_out_with_the_last_state_and_rides_out_outages(sleeps: list[float]) -> None:
    adapter = ConsoleAdapter(Script(_action_json("UNKNOWN")))
    adapter.faults = ["refused"] * 5  # the first read fails every attempt; later reads answer
    console = _client(
        "ect_x", adapter, sleeps, clock=FakeClock(sleeps), retry=RetryPolicy(attempts=5, base_delay=1, jitter=0)
    )
    with pytest.raises(OutcomeTimeout) as timed_out:
        console.wait_for_outcome("refund:order-4821:request-1", timeout=60, poll_interval=10)
    assert timed_out.value.action is not None
    assert timed_out.value.action.status == "UNKNOWN"
    assert sum(sleeps) == pytest.approx(60)
