"""Running calls at the same instant, each in its own thread and database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection

THREAD_TIMEOUT = 30


def run_at_once(*calls: Callable[[], Any], timeout: float = THREAD_TIMEOUT) -> list[Any]:
    """Run each call in its own thread and connection, released together by a barrier.

    Returns each call's result in order. Any exception fails the caller's test ("the race
    raised instead of deciding"), so an IntegrityError from a database constraint can never
    be what quietly decides a race.
    """
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            # Connect before the barrier, so that the calls start together rather than
            # staggered by connection set-up.
            connection.ensure_connection()
            barrier.wait(timeout=timeout)
            results[index] = call()
        except BaseException as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index, call)) for index, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck (a lock never released?)"
    errors = [result for result in results if isinstance(result, BaseException)]
    assert not errors, f"the race raised instead of deciding: {errors!r}"
    return results
