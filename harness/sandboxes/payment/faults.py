"""Fault injection for the sandbox: queued faults and seeded probabilities.

A fault is chosen per request, under the sandbox lock, so a given seed and request order always
produce the same faults (a chaos run can be replayed).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CREATE_MODES", "LOOKUP_MODES", "TARGETS", "Fault", "FaultError", "FaultPlan"]

# What each mode does to POST /v1/refunds:
#   commit_then_timeout  store the refund, keep the key in flight for sleep_seconds, then answer
#   commit_then_500      store the refund, answer 500 (a resend with the key replays the success)
#   commit_then_drop     store the refund, close the connection without an answer
#   fail_before_commit   answer 500, store nothing (the key stays unused)
#   reject_invalid       answer 400 invalid_request_error, store nothing
#   rate_limit           answer 429, store nothing
#   pending              store the refund as pending; it settles after settle_after_seconds
#   slow                 hold the key in flight for sleep_seconds, then execute normally
#   created_with_status  store the refund with the given status (failed, canceled, ...)
CREATE_MODES = frozenset(
    {
        "commit_then_timeout",
        "commit_then_500",
        "commit_then_drop",
        "fail_before_commit",
        "reject_invalid",
        "rate_limit",
        "pending",
        "slow",
        "created_with_status",
    }
)
# For reads (GET /v1/refunds, /v1/refunds/{id}, /v1/charges/{id}) nothing is committed, so the
# commit_then_* modes mean "compute the answer, then fail to deliver it" and slow/timeout both
# mean "answer after sleep_seconds".
LOOKUP_MODES = CREATE_MODES - {"pending", "created_with_status"}
TARGETS = ("create", "lookup")
_STATUSES = frozenset({"succeeded", "pending", "failed", "canceled", "requires_action"})
_OUTCOMES = frozenset({"succeeded", "failed"})


class FaultError(ValueError):
    """A fault specification that the sandbox cannot honour (reported as HTTP 400)."""


@dataclass
class Fault:
    mode: str
    target: str = "create"
    sleep_seconds: float = 2.0
    settle_after_seconds: float | None = None
    outcome: str | None = None
    status: str | None = None
    # Queued faults only: which request they apply to and how many more times.
    id: str | None = None
    times: int = 1
    action_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(spec: dict[str, Any], name: str, default: float | None) -> float | None:
    value = spec.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise FaultError(f"{name} must be a non-negative number")
    return float(value)


def _options(spec: dict[str, Any], target: str) -> dict[str, Any]:
    """Validate the options shared by queued and probabilistic faults."""
    if target not in TARGETS:
        raise FaultError(f"applies_to must be one of {list(TARGETS)}")
    outcome = spec.get("outcome")
    if outcome is not None and outcome not in _OUTCOMES:
        raise FaultError(f"outcome must be one of {sorted(_OUTCOMES)}")
    status = spec.get("status")
    if status is not None and status not in _STATUSES:
        raise FaultError(f"status must be one of {sorted(_STATUSES)}")
    sleep_seconds = _number(spec, "sleep_seconds", 2.0)
    assert sleep_seconds is not None
    return {
        "target": target,
        "sleep_seconds": sleep_seconds,
        "settle_after_seconds": _number(spec, "settle_after_seconds", None),
        "outcome": outcome,
        "status": status,
    }


def _check_mode(mode: Any, target: str) -> str:
    allowed = CREATE_MODES if target == "create" else LOOKUP_MODES
    if mode not in allowed:
        raise FaultError(f"mode for {target} must be one of {sorted(allowed)}, got {mode!r}")
    return str(mode)


class FaultPlan:
    """Queued faults (first match wins) and, failing those, a seeded random draw.

    Not thread-safe on its own: the sandbox calls it under its lock.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._ids = itertools.count(1)
        self.seed = seed
        self._rng = random.Random(seed)
        self._queue: list[Fault] = []
        self._probabilities: dict[str, dict[str, float]] = {}
        self._random_options: dict[str, dict[str, Any]] = {}
        self.fired: Counter[str] = Counter()
        self.history: deque[dict[str, Any]] = deque(maxlen=10_000)

    def reseed(self, seed: int | None) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def clear(self) -> None:
        self._queue.clear()
        self._probabilities.clear()
        self._random_options.clear()
        self.fired.clear()
        self.history.clear()

    def configure(self, spec: dict[str, Any]) -> list[Fault]:
        """Apply a POST /_sandbox/faults body; return the faults it queued."""
        if not isinstance(spec, dict):
            raise FaultError("the body must be a JSON object")
        target = spec.get("applies_to", "create")
        queued: list[Fault] = []
        if "seed" in spec:
            seed = spec["seed"]
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise FaultError("seed must be an integer or null")
            self.reseed(seed)
        if "probabilities" in spec:
            self._set_probabilities(spec, target)
        if "mode" in spec:
            queued.append(self._enqueue(spec, target))
        if not {"seed", "probabilities", "mode"} & spec.keys():
            raise FaultError('give a "mode" to queue a fault, "probabilities", or a "seed"')
        return queued

    def _enqueue(self, spec: dict[str, Any], target: str) -> Fault:
        options = _options(spec, target)
        mode = _check_mode(spec["mode"], target)
        times = spec.get("times", 1)
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise FaultError("times must be a positive integer")
        action_id = spec.get("action_id")
        if action_id is not None:
            if target != "create":
                raise FaultError("action_id can only be matched on create faults")
            if not isinstance(action_id, str):
                raise FaultError("action_id must be a string")
        if mode == "created_with_status" and options["status"] is None:
            raise FaultError('created_with_status needs a "status"')
        fault = Fault(
            mode=mode, id=f"flt_{next(self._ids)}", times=times, action_id=action_id, **options
        )
        self._queue.append(fault)
        return fault

    def _set_probabilities(self, spec: dict[str, Any], target: str) -> None:
        options = _options(spec, target)
        probabilities = spec["probabilities"]
        if not isinstance(probabilities, dict):
            raise FaultError("probabilities must be an object of mode -> probability")
        checked: dict[str, float] = {}
        for mode, p in probabilities.items():
            _check_mode(mode, target)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
                raise FaultError(f"probability for {mode} must be between 0 and 1")
            checked[mode] = float(p)
        if sum(checked.values()) > 1 + 1e-9:
            raise FaultError("probabilities must add up to at most 1")
        if "created_with_status" in checked and options["status"] is None:
            raise FaultError('created_with_status needs a "status"')
        self._probabilities[target] = checked
        self._random_options[target] = options

    def pick(self, target: str, *, action_id: str | None = None) -> Fault | None:
        """The fault for this request, if any; consumes one use of a queued fault."""
        for fault in self._queue:
            if fault.target != target:
                continue
            if fault.action_id is not None and fault.action_id != action_id:
                continue
            fault.times -= 1
            if fault.times <= 0:
                self._queue.remove(fault)
            return self._fired(fault, target, action_id, "queued")
        probabilities = self._probabilities.get(target)
        if not probabilities:
            return None
        # One draw per request whatever the outcome, so the sequence depends only on the seed
        # and the number of requests.
        draw = self._rng.random()
        cumulative = 0.0
        for mode, p in sorted(probabilities.items()):
            cumulative += p
            if draw < cumulative:
                fault = Fault(mode=mode, **self._random_options[target])
                return self._fired(fault, target, action_id, "random")
        return None

    def _fired(self, fault: Fault, target: str, action_id: str | None, source: str) -> Fault:
        self.fired[f"{target}:{fault.mode}"] += 1
        self.history.append(
            {
                "at": time.time(),
                "target": target,
                "mode": fault.mode,
                "action_id": action_id,
                "source": source,
                "fault_id": fault.id,
            }
        )
        return fault

    def to_json(self) -> dict[str, Any]:
        return {
            "queued": [fault.to_json() for fault in self._queue],
            "probabilities": {
                target: {"modes": dict(modes), **self._random_options[target]}
                for target, modes in self._probabilities.items()
            },
            "seed": self.seed,
            "fired": dict(self.fired),
            "history": list(self.history)[-100:],
        }
