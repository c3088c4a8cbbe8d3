"""The sandbox provider over HTTP: Stripe-shaped refunds, idempotency, totals and faults.

These tests speak raw HTTP so that they pin down the sandbox's own behaviour; the adapter's
mapping of that behaviour is in test_stripe_adapter.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from tests.providers.sandbox_client import SandboxClient, wait_for

pytestmark = pytest.mark.processes

ACTION = "refund:order-1:request-1"


def _refund(sandbox: SandboxClient, *, key: str | None = ACTION, **params: Any) -> Any:
    params.setdefault("charge", "ch_1")
    params.setdefault("amount", 1000)
    params.setdefault("metadata", {"action_id": ACTION})
    return sandbox.post_refund(key=key, **params)


@pytest.fixture
def charge(sandbox: SandboxClient) -> dict[str, Any]:
    return sandbox.seed_charge("ch_1", 5000, "eur")


# -- the Stripe-shaped API ---------------------------------------------------------------------


def test_it_creates_a_stripe_shaped_refund_with_metadata(sandbox: SandboxClient, charge: Any) -> None:
    response = _refund(sandbox, reason="requested_by_customer")
    assert response.status_code == 200
    refund = response.json()
    assert refund["object"] == "refund"
    assert refund["id"].startswith("re_")
    assert (refund["charge"], refund["amount"], refund["currency"]) == ("ch_1", 1000, "eur")
    assert refund["status"] == "succeeded"
    assert refund["metadata"] == {"action_id": ACTION}
    assert refund["reason"] == "requested_by_customer"
    assert isinstance(refund["created"], int)
    assert sandbox.get(f"/v1/refunds/{refund['id']}").json() == refund


def test_it_reports_refunded_amounts_on_the_charge(sandbox: SandboxClient, charge: Any) -> None:
    _refund(sandbox, amount=1200)
    body = sandbox.get("/v1/charges/ch_1").json()
    assert (body["object"], body["amount"], body["amount_refunded"]) == ("charge", 5000, 1200)
    assert body["refunded"] is False


def test_it_answers_stripe_shaped_errors_for_unknown_objects(sandbox: SandboxClient) -> None:
    response = sandbox.get("/v1/refunds/re_missing")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["code"] == "resource_missing"
    assert sandbox.get("/v1/charges/ch_missing").status_code == 404


def test_it_refuses_a_refund_on_a_charge_that_does_not_exist(sandbox: SandboxClient) -> None:
    response = _refund(sandbox, charge="ch_missing")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "resource_missing"
    assert response.json()["error"]["param"] == "charge"
    assert sandbox.ledger() == []


def test_it_refuses_unknown_parameters_like_stripe(sandbox: SandboxClient, charge: Any) -> None:
    response = _refund(sandbox, payment_intent="pi_1")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parameter_unknown"
    assert sandbox.ledger() == []


def test_it_requires_a_secret_test_key(sandbox: SandboxClient, charge: Any) -> None:
    assert _refund(sandbox, api_key="pk_test_public").status_code == 401
    no_auth = requests.get(f"{sandbox.url}/v1/refunds", timeout=5)
    assert no_auth.status_code == 401
    assert no_auth.json()["error"]["type"] == "invalid_request_error"
    basic = requests.get(f"{sandbox.url}/v1/refunds", auth=("sk_test_basic", ""), timeout=5)
    assert basic.status_code == 200
    assert sandbox.ledger() == []


# -- totals and currency -----------------------------------------------------------------------


def test_it_never_refunds_more_than_the_charge(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 1000)
    assert _refund(sandbox, key="a", amount=600).status_code == 200
    too_large = _refund(sandbox, key="b", amount=500)
    assert too_large.status_code == 400
    assert too_large.json()["error"]["type"] == "invalid_request_error"
    assert too_large.json()["error"]["code"] == "amount_too_large"
    assert "greater than unrefunded amount" in too_large.json()["error"]["message"]
    assert _refund(sandbox, key="c", amount=400).status_code == 200
    exhausted = _refund(sandbox, key="d", amount=1)
    assert exhausted.status_code == 400
    assert exhausted.json()["error"]["code"] == "charge_already_refunded"
    assert sum(r["amount"] for r in sandbox.ledger()) == 1000
    assert sandbox.get("/v1/charges/ch_1").json()["refunded"] is True


def test_it_refunds_the_remainder_when_no_amount_is_given(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 1000)
    _refund(sandbox, key="a", amount=300)
    response = sandbox.post_refund(key="b", charge="ch_1", metadata={"action_id": "b"})
    assert response.json()["amount"] == 700


def test_it_refuses_a_currency_that_differs_from_the_charge(sandbox: SandboxClient, charge: Any) -> None:
    response = _refund(sandbox, currency="usd")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "currency_mismatch"
    assert _refund(sandbox, key="same-currency", currency="EUR").status_code == 200
    assert len(sandbox.ledger()) == 1


def test_concurrent_refunds_for_the_last_of_a_charge_are_serialised(
    sandbox: SandboxClient,
) -> None:
    sandbox.seed_charge("ch_1", 1000)
    results: list[int] = []

    def attempt(n: int) -> None:
        with requests.Session() as session:
            client = SandboxClient(sandbox.url, session)
            results.append(_refund(client, key=f"race-{n}", amount=300).status_code)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [200, 200, 200, 400, 400, 400, 400, 400]
    assert sum(r["amount"] for r in sandbox.ledger()) == 900


# -- idempotency -------------------------------------------------------------------------------


def test_it_replays_a_stored_response(sandbox: SandboxClient, charge: Any) -> None:
    first = _refund(sandbox)
    second = _refund(sandbox)
    assert second.status_code == first.status_code == 200
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(sandbox.ledger()) == 1


def test_it_replays_a_stored_error_with_the_same_status(sandbox: SandboxClient) -> None:
    first = _refund(sandbox, charge="ch_later")
    sandbox.seed_charge("ch_later", 5000)
    second = _refund(sandbox, charge="ch_later")
    assert (first.status_code, second.status_code) == (400, 400)
    assert second.json() == first.json()
    assert sandbox.ledger() == []


def test_it_does_not_store_a_request_that_failed_parameter_validation(sandbox: SandboxClient, charge: Any) -> None:
    invalid = sandbox.post_refund(key=ACTION, charge="ch_1", amount="ten")
    assert invalid.status_code == 400
    assert invalid.json()["error"]["code"] == "parameter_invalid_integer"
    valid = _refund(sandbox)
    assert valid.status_code == 200


def test_it_refuses_a_key_reused_with_different_parameters(sandbox: SandboxClient, charge: Any) -> None:
    assert _refund(sandbox, amount=1000).status_code == 200
    reused = _refund(sandbox, amount=1001)
    assert reused.status_code == 400
    assert reused.json()["error"]["type"] == "idempotency_error"
    assert len(sandbox.ledger()) == 1


def test_it_answers_409_to_a_concurrent_request_with_a_key_in_flight(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="slow", sleep_seconds=1.5)
    first: list[requests.Response] = []
    thread = threading.Thread(target=lambda: first.append(_refund(sandbox)))
    thread.start()
    wait_for(lambda: sandbox.faults()["fired"].get("create:slow") == 1, what="the slow fault")
    concurrent = _refund(sandbox)
    thread.join()
    assert concurrent.status_code == 409
    assert concurrent.json()["error"]["code"] == "idempotency_key_in_use"
    assert first[0].status_code == 200
    assert _refund(sandbox).json()["id"] == first[0].json()["id"]
    assert len(sandbox.ledger()) == 1


def test_it_keeps_a_key_for_the_retention_window(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.configure(key_retention_seconds=60)
    first = _refund(sandbox).json()
    sandbox.advance_clock(59)
    assert _refund(sandbox).json()["id"] == first["id"]
    assert len(sandbox.ledger()) == 1


def test_a_resend_after_key_retention_creates_a_second_refund(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.configure(key_retention_seconds=60)
    first = _refund(sandbox).json()
    sandbox.advance_clock(61)
    second = _refund(sandbox)
    assert second.status_code == 200
    assert second.json()["id"] != first["id"]
    ledger = sandbox.ledger()
    assert [r["sandbox"]["idempotency_key"] for r in ledger] == [ACTION, ACTION]
    assert sum(r["amount"] for r in ledger) == 2000


def test_retention_defaults_to_24_hours(sandbox: SandboxClient, charge: Any) -> None:
    first = _refund(sandbox).json()
    sandbox.advance_clock(24 * 3600 - 5)
    assert _refund(sandbox).json()["id"] == first["id"]
    sandbox.advance_clock(10)
    assert _refund(sandbox).json()["id"] != first["id"]


# -- listing -----------------------------------------------------------------------------------


def test_it_hides_new_refunds_from_lists_until_the_visibility_delay(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.configure(lookup_visibility_delay_seconds=30)
    refund = _refund(sandbox).json()
    assert sandbox.get("/v1/refunds", charge="ch_1").json()["data"] == []
    assert sandbox.get(f"/v1/refunds/{refund['id']}").status_code == 200
    assert sandbox.ledger()[0]["sandbox"]["visible"] is False
    sandbox.advance_clock(31)
    assert [r["id"] for r in sandbox.get("/v1/refunds", charge="ch_1").json()["data"]] == [refund["id"]]


def test_it_lists_refunds_newest_first_with_pagination(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 10_000)
    sandbox.seed_charge("ch_2", 10_000)
    created = [_refund(sandbox, key=f"k{n}", amount=100).json()["id"] for n in range(5)]
    _refund(sandbox, key="other", charge="ch_2", amount=100)

    pages = []
    starting_after = None
    while True:
        params: dict[str, Any] = {"charge": "ch_1", "limit": 2}
        if starting_after:
            params["starting_after"] = starting_after
        body = sandbox.get("/v1/refunds", **params).json()
        assert body["object"] == "list"
        pages.append([r["id"] for r in body["data"]])
        if not body["has_more"]:
            break
        starting_after = body["data"][-1]["id"]
    assert pages == [created[:2:-1], created[2:0:-1], created[:1]]

    before = sandbox.get("/v1/refunds", charge="ch_1", limit=2, ending_before=created[1])
    assert [r["id"] for r in before.json()["data"]] == [created[3], created[2]]
    assert len(sandbox.get("/v1/refunds", limit=100).json()["data"]) == 6


def test_it_validates_list_parameters(sandbox: SandboxClient, charge: Any) -> None:
    assert sandbox.get("/v1/refunds", limit=101).status_code == 400
    assert sandbox.get("/v1/refunds", limit=0).status_code == 400
    assert sandbox.get("/v1/refunds", starting_after="re_missing").status_code == 400
    assert sandbox.get("/v1/refunds", charge="ch_missing").status_code == 404
    # created is Stripe's range filter (created[gte]=...): a value that is no whole number is refused.
    assert sandbox.get("/v1/refunds", created="soon").status_code == 400
    assert sandbox.get("/v1/refunds", **{"created[gte]": "-1"}).status_code == 400


# -- pending refunds ---------------------------------------------------------------------------


def test_a_pending_refund_settles_as_succeeded_after_the_configured_delay(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.configure(pending_settle_after_seconds=120)
    sandbox.fault(mode="pending")
    refund = _refund(sandbox).json()
    assert refund["status"] == "pending"
    sandbox.advance_clock(119)
    assert sandbox.get(f"/v1/refunds/{refund['id']}").json()["status"] == "pending"
    sandbox.advance_clock(2)
    assert sandbox.get(f"/v1/refunds/{refund['id']}").json()["status"] == "succeeded"


def test_a_failed_settlement_gives_the_amount_back_to_the_charge(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 1000)
    sandbox.fault(mode="pending", outcome="failed", settle_after_seconds=10)
    refund = _refund(sandbox, amount=1000).json()
    assert _refund(sandbox, key="while-pending", amount=1).json()["error"]["code"] == ("charge_already_refunded")
    sandbox.advance_clock(11)
    settled = sandbox.get(f"/v1/refunds/{refund['id']}").json()
    assert settled["status"] == "failed"
    assert settled["failure_reason"]
    assert sandbox.get("/v1/charges/ch_1").json()["amount_refunded"] == 0
    assert _refund(sandbox, key="after-failure", amount=1000).status_code == 200


def test_pending_refunds_can_be_settled_on_demand(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="pending", times=2, settle_after_seconds=3600)
    first = _refund(sandbox, key="a").json()
    second = _refund(sandbox, key="b").json()
    assert sandbox.settle(refund=first["id"], outcome="failed") == [{"id": first["id"], "status": "failed"}]
    assert sandbox.settle() == [{"id": second["id"], "status": "succeeded"}]
    assert sandbox.get(f"/v1/refunds/{first['id']}").json()["status"] == "failed"
    assert sandbox.get(f"/v1/refunds/{second['id']}").json()["status"] == "succeeded"


# -- faults ------------------------------------------------------------------------------------


def test_commit_then_500_stores_the_refund_and_a_resend_replays_it(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="commit_then_500")
    failed = _refund(sandbox)
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "api_error"
    [stored] = sandbox.ledger()
    resend = _refund(sandbox)
    assert resend.status_code == 200
    assert resend.json()["id"] == stored["id"]
    assert len(sandbox.ledger()) == 1


def test_commit_then_drop_stores_the_refund_and_closes_the_connection(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="commit_then_drop")
    with pytest.raises(requests.ConnectionError):
        _refund(sandbox)
    [stored] = sandbox.ledger()
    assert _refund(sandbox).json()["id"] == stored["id"]


def test_commit_then_timeout_stores_the_refund_and_answers_too_late(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="commit_then_timeout", sleep_seconds=1.5)
    with pytest.raises(requests.Timeout):
        _refund(sandbox, timeout=0.3)
    [stored] = sandbox.ledger()
    # The original request is still "running" at the provider, so its key is in use.
    assert _refund(sandbox).status_code == 409
    wait_for(lambda: _refund(sandbox).status_code == 200, what="the key to be released")
    assert _refund(sandbox).json()["id"] == stored["id"]
    assert len(sandbox.ledger()) == 1


def test_fail_before_commit_stores_nothing_and_leaves_the_key_unused(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="fail_before_commit")
    failed = _refund(sandbox)
    assert failed.status_code == 500
    assert sandbox.ledger() == []
    retried = _refund(sandbox)
    assert retried.status_code == 200
    assert "Idempotent-Replayed" not in retried.headers


def test_reject_invalid_stores_nothing(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="reject_invalid")
    rejected = _refund(sandbox)
    assert rejected.status_code == 400
    assert rejected.json()["error"]["type"] == "invalid_request_error"
    assert sandbox.ledger() == []


def test_rate_limit_answers_429_and_stores_nothing(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="rate_limit")
    limited = _refund(sandbox)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit"
    assert sandbox.ledger() == []
    assert _refund(sandbox).status_code == 200


def test_it_can_create_refunds_that_are_failed_or_canceled_at_once(
    sandbox: SandboxClient,
) -> None:
    sandbox.seed_charge("ch_1", 1000)
    sandbox.fault(mode="created_with_status", status="failed")
    sandbox.fault(mode="created_with_status", status="canceled")
    assert _refund(sandbox, key="a", amount=1000).json()["status"] == "failed"
    assert _refund(sandbox, key="b", amount=1000).json()["status"] == "canceled"
    # Neither holds any of the charge.
    assert _refund(sandbox, key="c", amount=1000).json()["status"] == "succeeded"


def test_a_queued_fault_fires_the_given_number_of_times(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="fail_before_commit", times=2)
    codes = [_refund(sandbox, key=f"k{n}", amount=100).status_code for n in range(3)]
    assert codes == [500, 500, 200]
    assert sandbox.faults()["fired"] == {"create:fail_before_commit": 2}


def test_a_queued_fault_can_target_one_action(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="fail_before_commit", action_id="refund:target")
    other = _refund(sandbox, key="other", metadata={"action_id": "refund:other"})
    target = _refund(sandbox, key="target", metadata={"action_id": "refund:target"})
    assert (other.status_code, target.status_code) == (200, 500)


def test_probabilistic_faults_are_reproducible_with_a_seed(sandbox: SandboxClient) -> None:
    def run() -> list[int]:
        sandbox.reset()
        sandbox.seed_charge("ch_1", 100_000)
        sandbox.fault(probabilities={"fail_before_commit": 0.4, "rate_limit": 0.2}, seed=1234)
        return [_refund(sandbox, key=f"k{n}", amount=1).status_code for n in range(30)]

    first, second = run(), run()
    assert first == second
    assert {200, 429, 500} <= set(first)


def test_a_lookup_fault_fails_reads_without_touching_creates(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="fail_before_commit", applies_to="lookup")
    refund = _refund(sandbox).json()
    assert sandbox.get(f"/v1/refunds/{refund['id']}").status_code == 500
    assert sandbox.get(f"/v1/refunds/{refund['id']}").status_code == 200


def test_faults_can_be_listed_and_cleared(sandbox: SandboxClient, charge: Any) -> None:
    queued = sandbox.fault(mode="rate_limit", times=3)["queued"][0]
    assert queued["mode"] == "rate_limit"
    assert sandbox.faults()["queued"][0]["times"] == 3
    sandbox.control("DELETE", "faults")
    assert sandbox.faults()["queued"] == []
    assert _refund(sandbox).status_code == 200


def test_it_rejects_a_fault_it_cannot_honour(sandbox: SandboxClient) -> None:
    for spec in (
        {"mode": "explode"},
        {"mode": "pending", "applies_to": "lookup"},
        {"mode": "created_with_status"},
        {"probabilities": {"rate_limit": 0.7, "fail_before_commit": 0.7}},
    ):
        response = sandbox.session.post(f"{sandbox.url}/_sandbox/faults", json=spec, timeout=5)
        assert response.status_code == 400, spec
    assert sandbox.faults()["queued"] == []


# -- control endpoints -------------------------------------------------------------------------


def test_a_planted_refund_bypasses_the_rules_for_audit_tests(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 1000)
    _refund(sandbox, amount=1000)
    planted = sandbox.plant_refund(charge="ch_1", amount=1000, metadata={"action_id": ACTION}, idempotency_key=ACTION)
    assert planted["status"] == "succeeded"
    listed = sandbox.get("/v1/refunds", charge="ch_1").json()["data"]
    assert [r["metadata"]["action_id"] for r in listed] == [ACTION, ACTION]
    assert [r["sandbox"]["planted"] for r in sandbox.ledger()] == [False, True]


def test_reset_forgets_everything(sandbox: SandboxClient, charge: Any) -> None:
    sandbox.configure(key_retention_seconds=5)
    sandbox.fault(mode="rate_limit")
    sandbox.advance_clock(100)
    sandbox.reset()
    assert sandbox.ledger() == []
    assert sandbox.get("/v1/charges/ch_1").status_code == 404
    assert sandbox.faults()["queued"] == []
    assert sandbox.control("GET", "config")["key_retention_seconds"] == 24 * 3600
    assert sandbox.control("GET", "clock")["offset_seconds"] == 0


def test_it_refuses_a_charge_id_that_already_exists(sandbox: SandboxClient, charge: Any) -> None:
    response = sandbox.session.post(
        f"{sandbox.url}/_sandbox/charges",
        json={"id": "ch_1", "amount": 100, "currency": "eur"},
        timeout=5,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "resource_already_exists"


def test_it_rejects_unknown_config_keys(sandbox: SandboxClient) -> None:
    response = sandbox.session.post(f"{sandbox.url}/_sandbox/config", json={"retention": 5}, timeout=5)
    assert response.status_code == 400
    assert "unknown config keys" in response.json()["error"]["message"]


def test_the_clock_only_moves_forward(sandbox: SandboxClient) -> None:
    response = sandbox.session.post(f"{sandbox.url}/_sandbox/clock", json={"advance_seconds": -10}, timeout=5)
    assert response.status_code == 400
