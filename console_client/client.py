"""``ConsoleClient``: the agent API over HTTP, with safe retries.

Which calls are retried, and why that is safe: every call this API offers is idempotent by
its business references. A proposal names its refund request, so sending it again returns
the action that exists (200) or creates it if the first never arrived (201); a refund
request is opened once per ticket reference; reads change nothing. So after a timeout, a
dropped connection, a 5xx or a 429 the client sends *the same request* again, with
exponential backoff (or the server's Retry-After). Anything else (422, 409, 404, 401, 403)
is an answer, raised at once as a typed error. A call that is not idempotent would get one
attempt only (``_send(..., idempotent=False)``); none exists today.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import requests

from console_client.errors import (
    BadInput,
    Conflict,
    ConsoleError,
    NotAllowed,
    NotFound,
    OutcomeTimeout,
    Unavailable,
)
from console_client.models import DECISION_STATUSES, Action, ActionPage, RefundRequest

_RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})

# The API version this client is written against, sent as Console-Version with every request.
API_VERSION = "2026-12-01"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently an idempotent call is sent again.

    ``attempts`` counts the first one. The n-th wait is ``base_delay * 2**n`` seconds, at most
    ``max_delay``, less up to ``jitter`` of it at random (so that many agents do not retry in
    step); a Retry-After header from the console wins.
    """

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.25

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_delay)
        delay = min(self.base_delay * (2.0**retry), self.max_delay)
        return delay * (1 - self.jitter * random.random())


class ConsoleClient:
    """The agent API of one console, for one agent token.

    ``timeout`` is each HTTP request's timeout in seconds. ``sleep`` and ``clock`` exist for
    tests.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = base_url.rstrip("/") + "/api/v1"
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["Accept"] = "application/json, application/problem+json"
        self.session.headers["Console-Version"] = API_VERSION
        self._sleep = sleep
        self._clock = clock

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    # --- the calls --------------------------------------------------------------------------

    def open_refund_request(
        self, *, order_number: str, external_reference: str, reason_code: str, note: str = ""
    ) -> RefundRequest:
        """Open a refund request for a ticket, with the customer's reason code; the same reference
        again returns the same request."""
        response = self._send(
            "POST",
            "/refund-requests",
            json={
                "order_number": order_number,
                "external_reference": external_reference,
                "reason_code": reason_code,
                "note": note,
            },
        )
        data = response.json()
        return RefundRequest(
            order_number=str(data["order_number"]),
            request_number=int(data["request_number"]),
            external_reference=data.get("external_reference"),
            created=response.status_code == 201,
            raw=data,
        )

    def propose_refund(
        self,
        *,
        order_number: str,
        amount: Decimal | str,
        currency: str,
        reason_code: str,
        request_number: int | None = None,
        external_reference: str | None = None,
        evidence: str = "",
    ) -> Action:
        """Propose a refund for a refund request (by number or by ticket reference).

        Safe to call again with the same arguments: it returns the same action and never
        refunds twice. Raises Conflict if the request already has a different proposal.
        """
        if isinstance(amount, float):
            # Binary floating point cannot hold most decimal amounts (0.1 + 0.2).
            raise TypeError("Give the amount as a Decimal or a decimal string, not a float.")
        body: dict[str, Any] = {
            "order_number": order_number,
            "amount": format(amount, "f") if isinstance(amount, Decimal) else amount,
            "currency": currency,
            "reason_code": reason_code,
            "evidence": evidence,
        }
        if request_number is not None:
            body["request_number"] = request_number
        if external_reference is not None:
            body["external_reference"] = external_reference
        return Action.from_json(self._send("POST", "/refunds", json=body).json())

    def get_action(self, action_id: str) -> Action:
        """One of this agent's actions; NotFound for any other id."""
        return Action.from_json(self._send("GET", f"/actions/{quote(action_id, safe=':')}").json())

    def list_actions(self, *, status: Iterable[str] = (), cursor: str | None = None, limit: int = 50) -> ActionPage:
        params: list[tuple[str, str]] = [("status", name) for name in status]
        if cursor:
            params.append(("cursor", cursor))
        params.append(("limit", str(limit)))
        data = self._send("GET", "/actions", params=params).json()
        return ActionPage(items=[Action.from_json(item) for item in data["items"]], next_cursor=data["next_cursor"])

    def wait_for_outcome(
        self, action_id: str, timeout: float, *, poll_interval: float = 5.0, wait_for_approval: bool = False
    ) -> Action:
        """Read the action until it is final or a person is needed, at most ``timeout`` seconds.

        A person is needed when finance must resolve an unclear outcome (NEEDS_REVIEW), and
        also while a manager has to decide (PROPOSED, STALE); pass ``wait_for_approval=True``
        to keep waiting through the manager's decision. Raises OutcomeTimeout (with the last
        state read) when time runs out: that is not a failure, only "not yet"; never propose
        again because of it.
        """
        deadline = self._clock() + timeout
        action: Action | None = None
        while True:
            # A read is always safe to repeat: when it gets no answer, keep waiting until the
            # deadline with the last state read.
            with contextlib.suppress(Unavailable):
                action = self.get_action(action_id)
            if action is not None:
                if action.final:
                    return action
                if action.needs_person and not (wait_for_approval and action.status in DECISION_STATUSES):
                    return action
            remaining = deadline - self._clock()
            if remaining <= 0:
                state = action.status if action is not None else "unknown (no answer)"
                raise OutcomeTimeout(
                    f"{action_id} is still {state} after {timeout:g} seconds. Read it again later; do not propose "
                    "again.",
                    action=action,
                )
            self._sleep(min(poll_interval, remaining))

    # --- transport --------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: list[tuple[str, str]] | None = None,
        idempotent: bool = True,
    ) -> requests.Response:
        attempts = self.retry.attempts if idempotent else 1
        last = ""
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                response = self.session.request(method, self.api + path, json=json, params=params, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as error:
                # The request may or may not have reached the console: only an idempotent
                # call may be sent again.
                last = f"{type(error).__name__}: {error}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in _RETRYABLE_STATUSES:
                    raise _error(response)
                last = f"HTTP {response.status_code}"
                retry_after = _retry_after(response)
            if attempt + 1 < attempts:
                self._sleep(self.retry.delay(attempt, retry_after))
        raise Unavailable(
            f"No answer to {method} {path} after {attempts} attempt(s) ({last}). Whether it was recorded is unknown: "
            "send the same call again later, or read the action.",
            code="unavailable",
        )


def _retry_after(response: requests.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def _error(response: requests.Response) -> ConsoleError:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    status = response.status_code
    detail = str(problem.get("detail") or response.reason or f"HTTP {status}")
    code = str(problem.get("code", ""))
    kind: type[ConsoleError]
    if status == 404:
        kind = NotFound
    elif status == 409:
        kind = Conflict
    elif status in (401, 403):
        kind = NotAllowed
    elif status in (400, 413, 415, 422):
        kind = BadInput
    else:
        kind = ConsoleError
    return kind(detail, status=status, code=code, problem=problem)
