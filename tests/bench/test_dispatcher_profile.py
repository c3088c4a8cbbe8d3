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


def completion_counting(counts: Any) -> Completion:
    completion = Completion.__new__(Completion)  # no database: the counts are given
    completion.readings = 0
    completion.succeeded = lambda prefix: next(counts)  # type: ignore[method-assign]
    return completion


def test_dispatchers_that_make_no_progress_fail_the_run_with_their_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(step=0.5)
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    completion = completion_counting(itertools.chain([0, 3], itertools.repeat(3)))

    with pytest.raises(RuntimeError) as stalled:
        completion.wait("p", 10, dispatchers=FakeDispatchers(), timeout=600, stall=5)  # type: ignore[arg-type]

    message = str(stalled.value)
    assert message.startswith("no action of p succeeded for 5s (3 of 10 did):")
    assert "a batch claim failed" in message


def test_slow_but_steady_progress_is_waited_for_until_every_action_succeeded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(step=1.0)
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    # Readings a second apart, one more action every fourth: 4 s between successes, under the
    # 5 s stall, for 40 s in all, past the stall many times over.
    completion = completion_counting(itertools.chain.from_iterable(itertools.repeat(n, 4) for n in range(11)))

    finished = completion.wait("p", 10, dispatchers=FakeDispatchers(), timeout=600, stall=5)  # type: ignore[arg-type]

    assert finished >= 40
