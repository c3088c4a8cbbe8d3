"""`check --deploy` reports a production deployment whose audit trail cannot be signed."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from console.checks import trail_signing_key_check


@pytest.mark.parametrize("key", ["", "short-key", "demo-trail-signing-key-not-a-secret"])
def test_a_missing_short_or_demo_key_is_an_error(settings: Any, key: str) -> None:
    settings.TRAIL_SIGNING_KEY = key
    assert [message.id for message in trail_signing_key_check()] == ["console.E008"]
    with pytest.raises(SystemCheckError, match=r"console\.E008"):
        call_command("check", "--deploy", stdout=StringIO(), stderr=StringIO())


def test_a_long_random_key_passes(settings: Any) -> None:
    settings.TRAIL_SIGNING_KEY = "a-long-random-signing-key-0123456789abcdef"
    assert trail_signing_key_check() == []
