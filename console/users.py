"""Users and their roles, for set-up scripts (``manage.py create_user``).

A user gets roles (console.roles) and, for a manager, approval limits per currency. Superuser
status is never given here: separation of duties means no one set up by a script may both
correct and decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from approvals.models import ApprovalLimit
from console.roles import ADMIN, ROLES, ensure_roles


class UserInvalid(ValueError):
    """Bad input for a user. Nothing was written."""


@dataclass(frozen=True)
class UserResult:
    user: Any
    created: bool


def user_create_or_update(
    *,
    username: str,
    roles: Sequence[str],
    password: str | None = None,
    email: str = "",
    limits: Mapping[str, Decimal] | None = None,
    update: bool = False,
) -> UserResult:
    """Create a user with roles (or, with ``update``, add roles to an existing one).

    A password, when given, must pass the site's password validators; without one the user
    cannot log in until ``manage.py changepassword`` sets one (enough for an agent's owner).
    """
    username = username.strip()
    unknown = sorted(set(roles) - set(ROLES))
    if not username:
        raise UserInvalid("Give the user's name.")
    if not roles or unknown:
        raise UserInvalid(
            f"Give one or more roles from: {', '.join(ROLES)}" + (f" (not {', '.join(unknown)})." if unknown else ".")
        )
    for currency, amount in (limits or {}).items():
        if len(currency) != 3 or not currency.isalpha() or amount <= 0:
            raise UserInvalid(
                f"An approval limit is a currency and a positive amount, e.g. EUR:500 (not {currency}:{amount})."
            )
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.filter(username=username).first()
        created = user is None
        if user is not None and not update:
            raise UserInvalid(f"There is already a user {username!r}; use --update to add roles to it.")
        if user is None:
            user = user_model(username=username, email=email)
        elif email:
            user.email = email
        if password is not None:
            try:
                validate_password(password, user)
            except ValidationError as invalid:
                raise UserInvalid(" ".join(invalid.messages)) from None
            user.set_password(password)
        elif created:
            user.set_unusable_password()
        # The admin site needs staff status; it grants nothing by itself (the role's group does).
        user.is_staff = user.is_staff or ADMIN in roles
        user.save()
        ensure_roles()
        user.groups.add(*Group.objects.filter(name__in=roles))
        for currency, amount in (limits or {}).items():
            ApprovalLimit.objects.update_or_create(
                user=user, currency=currency.upper(), defaults={"max_amount": amount}
            )
    return UserResult(user=user, created=created)
