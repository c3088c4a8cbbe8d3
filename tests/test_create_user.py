"""manage.py create_user: users and roles for set-up scripts."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from approvals.models import ApprovalLimit

pytestmark = pytest.mark.django_db

GOOD_PASSWORD = "a-long-and-unusual-passphrase-42"


def create(*args: str) -> str:
    out = StringIO()
    call_command("create_user", *args, stdout=out)
    return out.getvalue()


def test_it_creates_a_manager_with_a_limit_and_a_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MARIA_PASSWORD", GOOD_PASSWORD)

    create("maria", "--role", "manager", "--limit", "EUR:500", "--password-env", "MARIA_PASSWORD")

    user = User.objects.get(username="maria")
    assert user.check_password(GOOD_PASSWORD)
    assert list(user.groups.values_list("name", flat=True)) == ["manager"]
    assert ApprovalLimit.objects.get(user=user, currency="EUR").max_amount == Decimal("500")
    assert not user.is_superuser and not user.is_staff


def test_a_password_file_and_several_roles(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(GOOD_PASSWORD + "\n")

    create("adam", "--role", "admin", "--role", "finance", "--password-file", str(secret))

    user = User.objects.get(username="adam")
    assert user.check_password(GOOD_PASSWORD)
    assert set(user.groups.values_list("name", flat=True)) == {"admin", "finance"}
    assert user.is_staff and not user.is_superuser


def test_an_agent_owner_without_a_password_cannot_log_in_and_can_own_an_agent() -> None:
    output = create("otto", "--role", "agent")

    assert "no password" in output
    assert not User.objects.get(username="otto").has_usable_password()
    err = StringIO()
    call_command("create_agent", "shop", "--scopes", "orders", "--owner", "otto", stdout=StringIO(), stderr=err)
    assert "scopes ['orders']" in err.getvalue()


def test_an_existing_user_is_refused_unless_updated() -> None:
    create("fiona", "--role", "finance")

    with pytest.raises(CommandError, match="--update"):
        create("fiona", "--role", "manager")
    create("fiona", "--role", "manager", "--update")

    assert set(User.objects.get(username="fiona").groups.values_list("name", flat=True)) == {"finance", "manager"}


@pytest.mark.parametrize(
    "args",
    [
        ("weak", "--role", "manager", "--password-env", "WEAK"),
        ("nobody", "--role", "manager", "--password-env", "UNSET_VARIABLE_FOR_TEST"),
        ("limits", "--role", "manager", "--limit", "EUR:lots"),
    ],
)
def test_bad_input_is_an_error_and_creates_nobody(
    args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    monkeypatch.setenv("WEAK", "123")
    settings.AUTH_PASSWORD_VALIDATORS = [{"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"}]

    with pytest.raises(CommandError):
        create(*args)
    assert not User.objects.exists()
