from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from actions.foundation import clock
from actions.services import Actor
from tests.factories import make_agent, make_user

pytest_plugins = ["tests.processes", "tests.mail"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``postgres`` need PostgreSQL. Outside CI they skip on SQLite with a reason;
    in CI (CI=true) a missing PostgreSQL fails the run instead of hiding the tests."""
    # The chaos run restarts PostgreSQL and flushes Redis: it goes last, so nothing runs after
    # it on connections it broke.
    items.sort(key=lambda item: item.nodeid.startswith("tests/chaos/"))
    on_postgres = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    if on_postgres:
        return
    if os.environ.get("CI", "").lower() == "true":
        raise pytest.UsageError(
            "CI=true but DATABASE_URL does not point at PostgreSQL: the postgres tests would not run."
        )
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://...")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """Every persona is a user with a password; the production hasher costs about a second
    per user by design, which no test here exercises."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def login_lockout_off(settings: Any) -> None:
    """django-axes refuses a login without a request, and Django's test client logs in without
    one. The lockout has its own tests (tests/security/test_login_defence.py), which switch it
    back on."""
    settings.AXES_ENABLED = False


@pytest.fixture(autouse=True)
def no_accounting_system(settings: Any) -> None:
    """Tests run without an accounting system unless they ask for one (``live_accounting``): the
    audits then read only the ledgers that exist, as in a deployment without one."""
    settings.ACCOUNTING_API_BASE = ""


@pytest.fixture(autouse=True)
def engine_clock_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's clock measures its offset from the database with one SELECT at most every
    30 s (actions.foundation.clock). Each test starts with it measured, at zero as on one
    machine, so that no test's statement count depends on when an earlier test last measured
    it. The clock's own tests make it measure again (``clock_offset_forget``)."""
    monkeypatch.setattr(clock, "_offset", timedelta(0))
    monkeypatch.setattr(clock, "_measured_at", time.monotonic())


@pytest.fixture(autouse=True)
def process_local_cache(settings: Any) -> None:
    """Production uses the database cache; tests use a process-local one, which tests without
    database access can clear. (The API's rate counters are a table of their own, rolled back
    with each test's transaction.)"""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.fixture
def manager(db: Any) -> Any:
    return make_user("maria.manager", "manager", limits={"EUR": "500", "USD": "500", "JPY": "50000"})


@pytest.fixture
def second_manager(db: Any) -> Any:
    return make_user("mark.manager", "manager", limits={"EUR": "100"})


@pytest.fixture
def finance(db: Any) -> Any:
    return make_user("fiona.finance", "finance")


@pytest.fixture
def console_admin(db: Any) -> Any:
    return make_user("adam.admin", "admin", is_staff=True)


@pytest.fixture
def agent_owner(db: Any) -> Any:
    return make_user("otto.owner", "agent")


@pytest.fixture
def agent(agent_owner: Any) -> Any:
    return make_agent(agent_owner)


@pytest.fixture
def agent_actor(agent: Any) -> Actor:
    return Actor.for_agent(agent)
