"""The dispatch benchmark's wait for its actions: it fails, with the dispatchers' logs, instead of
hanging when the dispatchers are alive but do nothing (seen: two dispatchers of 48 threads found
no database connection to be had and the run waited out its timeout, phase after phase)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.bench import dispatcher_profile as module
from tests.bench.dispatcher_profile import Completion


class FakeDispatchers:
    alive = True

    def log_tail(self) -> str:
        return "dispatcher: a batch claim failed; nothing of it was claimed"


def completion_counting(live: Any, *, succeeded: int = 10) -> Completion:
    completion = Completion.__new__(Completion)  # no database: the counts are given
    completion.readings = 0
    completion.live = lambda: next(live)  # type: ignore[method-assign]
    completion.succeeded = lambda prefix: succeeded  # type: ignore[method-assign]
    return completion


def test_dispatchers_that_make_no_progress_fail_the_run_with_their_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(step=0.5)
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    completion = completion_counting(itertools.chain([10, 7], itertools.repeat(7)))

    with pytest.raises(RuntimeError) as stalled:
        completion.wait("p", 10, dispatchers=FakeDispatchers(), timeout=600, stall=5)  # type: ignore[arg-type]

    message = str(stalled.value)
    assert message.startswith("no action of p left the live states for 5s (7 are live):")
    assert "a batch claim failed" in message


def test_slow_but_steady_progress_is_waited_for_until_every_action_succeeded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(step=1.0)
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    # Readings a second apart, one more action every fourth: 4 s between successes, under the
    # 5 s stall, for 40 s in all, past the stall many times over.
    completion = completion_counting(itertools.chain.from_iterable(itertools.repeat(n, 4) for n in range(10, -1, -1)))

    finished = completion.wait("p", 10, dispatchers=FakeDispatchers(), timeout=600, stall=5)  # type: ignore[arg-type]

    assert finished >= 40


def test_a_phase_that_drained_with_an_action_not_succeeded_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """No live action is the end of the phase, not its success: one refund FAILED_FINAL, say,
    leaves nothing live and 9 of 10 SUCCEEDED, and the run stops there with the logs."""
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    completion = completion_counting(iter([3, 1, 0]), succeeded=9)

    with pytest.raises(RuntimeError) as short:
        completion.wait("p", 10, dispatchers=FakeDispatchers(), timeout=600, stall=5)  # type: ignore[arg-type]

    assert str(short.value).startswith("p ended with 9 of 10 actions SUCCEEDED and none live:")
