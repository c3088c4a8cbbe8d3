"""The login lockout keys on the username and the address together, with a higher ceiling per
address: a guesser at one address cannot lock a colleague at the same address out, and spraying
guesses across usernames from one address still stops (console/login_lockout.py).

The attack this replays: from the same address as a guesser, felix was locked out too, because
the lockout counted per username or per address."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db

OFFICE = "203.0.113.9"  # felix's address, and the guesser's
ELSEWHERE = "198.51.100.7"


@pytest.fixture
def lockout_on(settings: Any) -> None:
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 10
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 30


def login(address: str, username: str, password: str = PASSWORD) -> int:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password}).status_code


def fail(address: str, username: str, times: int) -> None:
    for n in range(times):
        assert login(address, username, f"guess-{n}") in (200, 429)


def test_the_address_ceiling_is_higher_than_the_limit_per_username_by_default() -> None:
    from django.conf import settings

    assert settings.LOGIN_ADDRESS_FAILURE_LIMIT > settings.AXES_FAILURE_LIMIT
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


def test_a_guesser_does_not_lock_out_a_colleague_at_the_same_address(lockout_on: None) -> None:
    felix = make_user("felix", "manager")
    make_user("xavier", "manager")

    fail(OFFICE, "xavier", 10)

    assert login(OFFICE, felix.username) == 302
    # The guesser is locked out of that username from that address, even with the right password.
    assert login(OFFICE, "xavier") == 429
    # xavier himself, from elsewhere, is not.
    assert login(ELSEWHERE, "xavier") == 302


def test_the_tenth_failure_for_one_username_from_one_address_is_the_lockout(lockout_on: None) -> None:
    make_user("xavier", "manager")

    fail(OFFICE, "xavier", 9)
    assert login(OFFICE, "xavier") == 302

    fail(OFFICE, "xavier", 10)
    assert login(OFFICE, "xavier") == 429


def test_spraying_usernames_from_one_address_meets_the_address_ceiling(lockout_on: None) -> None:
    felix = make_user("felix", "manager")
    # 29 failures across usernames, at most 3 for any one: below every limit.
    for n in range(29):
        assert login(OFFICE, f"nobody-{n % 10}", f"guess-{n}") == 200
    assert login(OFFICE, felix.username) == 302

    assert login(OFFICE, "nobody-0", "guess-29") == 429  # the 30th failure from the address

    assert login(OFFICE, felix.username) == 429
    assert login(OFFICE, "someone-new", "guess") == 429
    assert login(ELSEWHERE, felix.username) == 302
