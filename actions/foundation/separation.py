"""Separation of duties as pure rules: who may not do what, whatever permissions they hold.

Roles are groups (console/roles.py), and a role's permissions are the first line. These rules
are the second: a person who corrects the console (an admin) never also decides about money or
closes finance's follow-ups, even when a superuser flag or a stray permission says otherwise.
"""

from __future__ import annotations

from typing import Any

from actions.foundation.security import CORRECT_PERMISSION


def is_console_admin(user: Any) -> bool:
    return bool(getattr(user, "is_authenticated", False) and (user.is_superuser or user.has_perm(CORRECT_PERMISSION)))


def follow_up_admin_refusal(*, user: Any) -> str | None:
    """Why ``user`` may not advance (close, explain) a remedy or a discrepancy, or None.

    Finance works follow-ups; an admin who could close them could also hide a duplicate
    refund that his own correction caused.
    """
    if is_console_admin(user):
        return (
            "Admins cannot advance remedies or discrepancies: finance works them (separation of duties). "
            "Reassign it to someone in finance instead."
        )
    return None
