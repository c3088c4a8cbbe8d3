"""A pytest plugin for mutation runs (``make mutate``): the fast subset of the suite.

mutmut runs one pytest session per mutant, so every test it selects runs hundreds of times. Tests
that need the sandbox provider's process are left out (they start a real process and some wait
for its timeouts); the rest of the engine's tests drive receivers in memory.

``MUTATE_TESTS`` narrows the subset further to the given test paths or node id prefixes,
separated by spaces, for a quick run over one module.
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import IO

import pytest
from django.core.management import call_command
from pytest_django.plugin import validate_django_db

# Mutants run side by side (``--max-children``) each need a test database of their own: a
# session empties its database at the start (below), which would wipe a neighbour's rows mid-test.
DATABASE_SLOTS = 8
# The actions' stateful test reaches most of the engine and runs 40 examples (36 s): every
# mutant it reaches but does not kill would pay for all of them. A few examples still catch the
# gross mutants; the targeted tests are there for the rest. (The workflows' stateful test keeps
# its 20: it asserts that its examples reached a pause and a compensation, which 6 do not.)
os.environ.setdefault("STATEFUL_MAX_EXAMPLES", "6")
_held_slot: int | None = None
_slot_handle: IO[str] | None = None  # the lock file stays open (and locked) for the whole session

PROCESS_FIXTURES = frozenset({"sandbox_process", "live_sandbox"})
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_setup"})


# mutmut's record of each test's duration, from its stats run (mutants/ is the working directory
# of every mutation run). A test it has not timed yet (written after that run) counts as instant.
STATS_FILE = "mutmut-stats.json"


@pytest.hookimpl(trylast=True)  # after pytest-django has put the database tests in its order
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
    _fastest_first(items)


def _fastest_first(items: list[pytest.Item]) -> None:
    """Run the quickest tests first. mutmut stops a mutant's session at its first failing test
    (``-x``), so a killed mutant costs only the tests before its killer: in file order, a
    targeted test in a late file waited for every slow engine test before it. The order changes
    what a mutant costs, never whether it is killed (every selected test still runs until one
    fails). pytest-django's grouping is kept (tests in a transaction, then transactional ones,
    then the rest; a transactional test's flush removes what migrations wrote), and within a
    group the sort is stable, so tests of equal (or unknown) duration keep their file order."""
    try:
        with open(STATS_FILE) as handle:
            durations: dict[str, float] = json.load(handle).get("duration_by_test", {})
    except (OSError, ValueError):
        return  # no stats yet (mutmut's own stats run): file order
    items.sort(key=lambda item: (_django_group(item), durations.get(item.nodeid, 0.0)))


def _django_group(item: pytest.Item) -> int:
    """pytest-django's order: 0 for tests in a transaction, 1 for transactional ones, 2 for tests
    without a database (``pytest_django.plugin.pytest_collection_modifyitems``)."""
    marker = item.get_closest_marker("django_db")
    fixtures = getattr(item, "fixturenames", ())
    transactional = "transactional_db" in fixtures or "live_server" in fixtures
    if marker is not None:
        transaction, reset_sequences, *_ = validate_django_db(marker)
        transactional = transactional or transaction or reset_sequences
    if transactional:
        return 1
    return 0 if marker is not None or "db" in fixtures else 2


def pytest_sessionstart(session: pytest.Session) -> None:
    """Take the first free database slot (an fcntl lock, released when the process ends) and
    point the test database at it: ``test_console_mutants_0``, ``_1``, ... Each slot is kept
    between mutants (--reuse-db). The fork server's collection touches no database."""
    global _held_slot, _slot_handle
    if session.config.option.collectonly or _held_slot is not None:
        return
    from django.conf import settings
    from django.db import connections

    for slot in range(DATABASE_SLOTS):
        handle = open(f"/tmp/console-mutants-db-{slot}.lock", "w")  # noqa: SIM115 -- held open
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held_slot, _slot_handle = slot, handle
        base = settings.DATABASES["default"].setdefault("TEST", {}).get("NAME") or "test_console"
        name = f"{base}_{slot}"
        settings.DATABASES["default"]["TEST"]["NAME"] = name
        connections["default"].settings_dict.setdefault("TEST", {})["NAME"] = name
        return
    raise RuntimeError(f"all {DATABASE_SLOTS} mutation database slots are taken")


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
