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
from django.core.management import call_command

PROCESS_FIXTURES = frozenset({"sandbox_process", "live_sandbox"})
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_setup"})


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


def _uses_database(item: pytest.Item) -> bool:
    return item.get_closest_marker("django_db") is not None or not DATABASE_FIXTURES.isdisjoint(
        getattr(item, "fixturenames", ())
    )


@pytest.fixture(scope="session", autouse=True)
def mutation_run_starts_from_an_empty_database(request: pytest.FixtureRequest) -> None:
    """The test database is kept between mutants (--reuse-db). A mutant stopped by mutmut's
    timeout in the middle of a transactional test never reaches that test's flush, and its rows
    would make the next mutant's tests fail for a reason that has nothing to do with it."""
    if not any(_uses_database(item) for item in request.session.items):
        return
    request.getfixturevalue("django_db_setup")
    with request.getfixturevalue("django_db_blocker").unblock():
        call_command("flush", interactive=False, verbosity=0)
