"""System checks of this deployment's own settings, run by `manage.py check --deploy`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register


@register(Tags.security, deploy=True)
def metrics_token_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """/metrics must not be open to anyone in production: it tells an outsider how many
    refunds are stuck and for how long, which is worth knowing before an attack."""
    if settings.METRICS_TOKEN:
        if len(settings.METRICS_TOKEN) < 32:
            return [
                Error(
                    "METRICS_TOKEN is shorter than 32 characters.",
                    hint="Use a long random value, e.g. from `python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))'`.",
                    id="console.E002",
                )
            ]
        return []
    return [
        Error(
            "METRICS_TOKEN is empty: /metrics is open to anyone outside production mode, and refuses every "
            "scraper in it.",
            hint="Set METRICS_TOKEN to a long random value and give it to the metrics scraper.",
            id="console.E001",
        )
    ]


@register(Tags.security, deploy=True)
def production_mode_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A deployment checked with --deploy is a production one: the demo conveniences (orders
    typed in the admin, open metrics) must be off."""
    if not settings.PRODUCTION_MODE:
        return [
            Error(
                "PRODUCTION_MODE is off: admins may create orders by hand and /metrics may be open.",
                hint="Unset PRODUCTION_MODE (it follows DEBUG) or set PRODUCTION_MODE=1.",
                id="console.E003",
            )
        ]
    return []


@register()
def receiver_rate_limits_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A rate limit the `limits` library cannot read would leave its receiver unthrottled."""
    from actions.engine.throttle import rate_limit_problems

    problems = rate_limit_problems()
    if not problems:
        return []
    return [
        Error(
            f"RECEIVER_RATE_LIMITS has limits that cannot be read: {', '.join(problems)}.",
            hint='Write each as name=N/second (or /minute, /hour), separated by ";", e.g. '
            '"provider=100/second;accounting system=60/minute".',
            id="console.E004",
        )
    ]
