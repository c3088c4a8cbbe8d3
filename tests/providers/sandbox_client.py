"""A small HTTP client for the sandbox's API and control endpoints, used by the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import requests

API_KEY = "sk_test_providers_suite"


@dataclass
class SandboxClient:
    url: str
    session: requests.Session

    # -- control endpoints ---------------------------------------------------------------------

    def control(self, method: str, name: str, body: dict[str, Any] | None = None) -> Any:
        response = self.session.request(method, f"{self.url}/_sandbox/{name}", json=body, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def reset(self) -> None:
        self.control("POST", "reset")

    def seed_charge(self, charge_id: str, amount: int, currency: str = "eur") -> dict[str, Any]:
        result: dict[str, Any] = self.control(
            "POST", "charges", {"id": charge_id, "amount": amount, "currency": currency}
        )
        return result

    def configure(self, **values: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "config", values)
        return result

    def fault(self, **spec: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "faults", spec)
        return result

    def faults(self) -> dict[str, Any]:
        result: dict[str, Any] = self.control("GET", "faults")
        return result

    def advance_clock(self, seconds: float) -> None:
        self.control("POST", "clock", {"advance_seconds": seconds})

    def settle(self, **body: Any) -> list[dict[str, Any]]:
        settled: list[dict[str, Any]] = self.control("POST", "settle", body)["settled"]
        return settled

    def plant_refund(self, **body: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "refunds", body)
        return result

    def ledger(self) -> list[dict[str, Any]]:
        refunds: list[dict[str, Any]] = self.control("GET", "ledger")["data"]
        return refunds

    # -- the Stripe-shaped API, spoken by hand ---------------------------------------------------

    def post_refund(
        self,
        *,
        key: str | None = None,
        timeout: float = 10,
        api_key: str = API_KEY,
        **params: Any,
    ) -> requests.Response:
        """POST /v1/refunds form-encoded like Stripe; ``metadata={...}`` becomes metadata[k]."""
        form: list[tuple[str, str]] = []
        for name, value in params.items():
            if isinstance(value, dict):
                form.extend((f"{name}[{k}]", str(v)) for k, v in value.items())
            else:
                form.append((name, str(value)))
        headers = {"Authorization": f"Bearer {api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return self.session.post(f"{self.url}/v1/refunds", data=form, headers=headers, timeout=timeout)

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.session.get(
            f"{self.url}{path}",
            params=params,
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=10,
        )


def wait_for(predicate: Callable[[], object], *, timeout: float = 5.0, what: str = "it") -> None:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
