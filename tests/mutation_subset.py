"""A pytest plugin for mutation runs (``make mutate``): the fast subset of the suite.

mutmut runs one pytest session per mutant, so every test it selects runs hundreds of times. Tests
that need the sandbox provider's process are left out (they start a real process and some wait
for its timeouts); the rest of the engine's tests drive receivers in memory.

``MUTATE_TESTS`` narrows the subset further to the given test paths or node id prefixes,
separated by spaces, for a quick run over one module.
"""

from __future__ import annotations

import os

import pytest

PROCESS_FIXTURES = frozenset({"sandbox_process", "live_sandbox"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = os.environ.get("MUTATE_TESTS", "").split()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        needs_process = not PROCESS_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        outside = bool(only) and not any(item.nodeid.startswith(prefix) for prefix in only)
        (dropped if needs_process or outside else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
