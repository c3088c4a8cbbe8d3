"""The same proposal sent twice at once over HTTP, on PostgreSQL with one connection per thread.

Each round lines two clients up on a barrier, so that both requests are inside the proposal
service together; the UNIQUE action id decides, and the loser answers with the winner's row.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from actions.models import Action, ActionEvent, Agent
from tests.api.conftest import ApiClient
from tests.factories import make_order, make_request

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 4
THREAD_TIMEOUT = 30


def send_together(clients: list[ApiClient], body: dict[str, Any]) -> list[Any]:
    barrier = threading.Barrier(len(clients))
    responses: list[Any] = [None] * len(clients)

    def send(index: int, client: ApiClient) -> None:
        try:
            connection.ensure_connection()
            barrier.wait(timeout=THREAD_TIMEOUT)
            responses[index] = client.post("/api/v1/refunds", body)
        except BaseException as exc:
            responses[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i, client)) for i, client in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=THREAD_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a request is stuck"
    errors = [response for response in responses if isinstance(response, BaseException)]
    assert not errors, errors
    return responses


@pytest.mark.parametrize("amount", ["40.00", "12.50"], ids=["manual-approval", "auto-approval"])
def test_the_same_proposal_sent_twice_at_once_records_one_action_and_two_consistent_answers(
    agent: Agent, token: str, dispatched: list[int], amount: str
) -> None:
    """Invariant 1 at the API's door: a retried proposal never becomes a second action, and an
    auto-approved one is published for dispatch once."""
    for round_number in range(ROUNDS):
        order = make_order(captured="100.00")
        make_request(order, 1)
        body = {
            "order_number": order.number,
            "request_number": 1,
            "amount": amount,
            "currency": "EUR",
            "reason_code": "damaged",
            "evidence": f"round {round_number}",
        }

        first, second = send_together([ApiClient(token), ApiClient(token)], body)

        assert sorted([first.status_code, second.status_code]) == [200, 201], (first.content, second.content)
        assert first.json()["action_id"] == second.json()["action_id"] == f"refund:order-{order.number}:request-1"
        assert first.json()["status"] == second.json()["status"]
        action = Action.objects.get(order=order)
        assert ActionEvent.objects.filter(action=action, transition="propose").count() == 1

    auto_approved = list(Action.objects.filter(status="AUTHORIZED").values_list("pk", flat=True))
    assert sorted(dispatched) == sorted(auto_approved)
    assert len(auto_approved) == (ROUNDS if amount == "12.50" else 0)
