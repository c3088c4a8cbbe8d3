"""Two dispatchers on one action at once: one claim, one provider call, one refund.

The first test uses two real Celery workers and the dispatch message published twice, as a
broker redelivery or a sweep racing an on-commit publish would. The second races dispatchers
in threads of this process (one connection each), mixing the message's blocking claim with the
sweep's SKIP LOCKED claim, over several rounds so more than one interleaving is likely.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from actions.engine.dispatch import execution_dispatch
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order
from actions.services import Actor
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.processes import WorkerPool, wait_until
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus
ROUNDS = 4
DISPATCHERS = 4  # below the connection pool's default size of 10, with the test's own connection
THREAD_TIMEOUT = 30


def propose_auto_approved(*, sandbox: SandboxClient, proposer: Actor) -> Action:
    order = make_order(captured="100.00")
    sandbox.seed_charge(order.charge_reference, 10000, "eur")
    request = make_request(order)
    result = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    )
    assert result.action.status == S.AUTHORIZED
    return result.action


def refunds_for(sandbox: SandboxClient, action: Action) -> list[dict[str, Any]]:
    return [r for r in sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]


def dispatch_results(log: str) -> list[str]:
    return [
        line.rsplit(": ", 1)[-1].strip("'")
        for line in log.splitlines()
        if "Task actions.tasks.dispatch[" in line and " succeeded in " in line
    ]


def assert_one_claim_and_one_refund(action: Action, sandbox: SandboxClient) -> None:
    action.refresh_from_db()
    [refund] = refunds_for(sandbox, action)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, refund["id"])
    assert ActionEvent.objects.filter(action=action, transition="begin_submission").count() == 1
    # Every call to the receiver is recorded before it is made (invariant 3): one attempt row
    # is one provider call.
    assert Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).count() == 1
    assert action.order_id is not None
    assert_order_money_adds_up(Order.objects.get(pk=action.order_id))


def test_two_workers_given_the_same_dispatch_at_once_make_one_provider_call(
    workers: WorkerPool, live_sandbox: SandboxClient, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariants 1 and 3: two workers receive the same action's dispatch at once; one claims
    the lease and calls the sandbox, the other finds the action taken and does nothing."""
    from actions.tasks import dispatch

    def publish_twice(action_pk: int) -> None:
        dispatch.delay(action_pk)
        dispatch.delay(action_pk)

    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", publish_twice)
    first, second = workers.start(), workers.start()
    # A slow answer keeps the winner inside its lease while the loser tries to claim.
    live_sandbox.fault(mode="slow", sleep_seconds=1)

    action = propose_auto_approved(sandbox=live_sandbox, proposer=agent_actor)

    wait_until(
        lambda: len(dispatch_results(first.log()) + dispatch_results(second.log())) == 2,
        what="both workers to finish their dispatch",
    )
    results = [dispatch_results(first.log()), dispatch_results(second.log())]
    assert sorted(results) == [["SUCCEEDED"], ["taken"]], f"each worker ran one dispatch: {results}"
    assert_one_claim_and_one_refund(action, live_sandbox)


def run_at_once(*calls: Callable[[], str]) -> list[str | BaseException]:
    """Run each call in its own thread and database connection, released by one barrier."""
    barrier = threading.Barrier(len(calls))
    results: list[str | BaseException] = ["not run"] * len(calls)

    def run(index: int, call: Callable[[], str]) -> None:
        try:
            connection.ensure_connection()  # connect first, so the calls start together
            barrier.wait(timeout=THREAD_TIMEOUT)
            results[index] = call()
        except BaseException as error:  # reported to the test, which asserts there were none
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT)
    return results


@pytest.mark.parametrize("round_number", range(ROUNDS))
def test_dispatchers_racing_in_threads_with_and_without_skip_locked_claim_once(
    live_sandbox: SandboxClient, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, round_number: int
) -> None:
    """Invariants 1 and 3: the message's claim (waits for the row lock) and the sweep's claim
    (SKIP LOCKED) racing on one action: exactly one submits, every other one leaves it alone."""
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda action_pk: None)
    action = propose_auto_approved(sandbox=live_sandbox, proposer=agent_actor)

    results = run_at_once(
        *(
            (lambda skip=index % 2 == 1: execution_dispatch(action_pk=action.pk, skip_locked=skip))
            for index in range(DISPATCHERS)
        )
    )

    assert sorted(map(str, results)) == sorted([S.SUCCEEDED] + ["taken"] * (DISPATCHERS - 1)), results
    assert_one_claim_and_one_refund(action, live_sandbox)
