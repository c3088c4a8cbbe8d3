"""Settings read from the environment: each reader gives the default when the variable is unset
or empty, so an operator's blank line in an env file means "the default", not an empty value."""

from __future__ import annotations

import os
from decimal import Decimal


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def env_decimal_map(name: str, default: str) -> dict[str, Decimal]:
    """Parse ``"EUR:50,USD:50"`` into ``{"EUR": Decimal("50"), ...}``."""
    raw = os.environ.get(name, default)
    result: dict[str, Decimal] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        currency, _, amount = item.partition(":")
        result[currency.strip().upper()] = Decimal(amount.strip())
    return result


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]
