"""Findings 5 and 7: login throttling and lockout, sessions that end, a password page for all."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from console.middleware import STARTED_KEY, session_expired
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def lockout_on(settings: Any) -> None:
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 10


def test_the_51st_login_attempt_is_locked_out_even_with_the_right_password(lockout_on: None, manager: Any) -> None:
    """The attack: 50 wrong passwords in 14 s, then the right one worked."""
    client = Client()
    answers = [
        client.post("/login/", {"username": manager.username, "password": f"guess-{n}"}).status_code for n in range(50)
    ]
    right = client.post("/login/", {"username": manager.username, "password": PASSWORD})

    assert answers[:9] == [200] * 9  # the form again, with "wrong password"
    assert set(answers[10:]) == {429}
    assert right.status_code == 429
    assert "_auth_user_id" not in client.session


def test_the_lockout_holds_per_address_across_usernames(lockout_on: None, settings: Any, manager: Any) -> None:
    """Per address, the ceiling is higher than per username (tests/security/test_login_lockout.py)."""
    client = Client(REMOTE_ADDR="203.0.113.9")
    for n in range(settings.LOGIN_ADDRESS_FAILURE_LIMIT):
        client.post("/login/", {"username": f"nobody-{n}", "password": "x"})

    assert client.post("/login/", {"username": manager.username, "password": PASSWORD}).status_code == 429
    other_address = Client(REMOTE_ADDR="198.51.100.7")
    assert other_address.post("/login/", {"username": manager.username, "password": PASSWORD}).status_code == 302


def test_the_lockout_ends_after_the_cool_off(lockout_on: None, settings: Any, manager: Any) -> None:
    settings.AXES_COOLOFF_TIME = 0.0001  # hours: well under a second
    client = Client()
    for n in range(10):
        client.post("/login/", {"username": manager.username, "password": f"guess-{n}"})
    time.sleep(0.5)
    assert client.post("/login/", {"username": manager.username, "password": PASSWORD}).status_code == 302


def test_an_idle_session_ends(settings: Any, manager: Any) -> None:
    client = Client()
    client.force_login(manager)
    assert client.get("/").status_code == 200
    session = Session.objects.get(session_key=client.session.session_key)
    # Every request pushes the expiry SESSION_COOKIE_AGE (the idle timeout) ahead.
    assert session.expire_date > timezone.now() + timedelta(seconds=settings.SESSION_IDLE_TIMEOUT_SECONDS - 60)
    Session.objects.filter(pk=session.pk).update(expire_date=timezone.now() - timedelta(seconds=1))

    response = client.get("/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_busy_session_still_ends_at_its_absolute_cap(settings: Any, manager: Any) -> None:
    client = Client()
    client.force_login(manager)
    assert client.get("/").status_code == 200
    session = client.session
    session[STARTED_KEY] = time.time() - settings.SESSION_MAX_AGE_SECONDS - 1
    session.save()

    response = client.get("/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert session_expired(started=time.time() - 60, now=time.time()) is False
    assert settings.SESSION_IDLE_TIMEOUT_SECONDS == 30 * 60


def test_every_user_can_change_their_password(db: Any) -> None:
    clerk = make_user("fred.finance", "finance")  # not staff
    client = Client()
    client.force_login(clerk)

    page = client.get("/account/password/")
    changed = client.post(
        "/account/password/",
        {
            "old_password": PASSWORD,
            "new_password1": "a-New-long-passphrase-42",
            "new_password2": "a-New-long-passphrase-42",
        },
    )

    assert page.status_code == 200
    assert changed.status_code == 302
    clerk.refresh_from_db()
    assert clerk.check_password("a-New-long-passphrase-42")
