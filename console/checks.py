"""System checks of this deployment's own settings, run by `manage.py check --deploy`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

# Secrets that are public because they are written in this repository (the development key,
# the sandbox's webhook secret): anyone can sign a session or a provider event with them.
DEVELOPMENT_SECRET_KEY = "django-insecure-development-key-change-me-in-production-0123456789"  # noqa: S105
SANDBOX_WEBHOOK_SECRET = "whsec_sandbox"  # noqa: S105


def known_secret_problems() -> list[tuple[str, str]]:
    """Each setting that holds a secret everyone knows or no secret at all, as (id, message)."""
    problems = []
    try:
        key = settings.SECRET_KEY or ""
    except ImproperlyConfigured:  # Django's own refusal of an empty SECRET_KEY
        key = ""
    if not key:
        problems.append(("console.E005", "SECRET_KEY is empty."))
    elif key == DEVELOPMENT_SECRET_KEY or key.startswith("django-insecure-"):
        problems.append(("console.E005", "SECRET_KEY is the development key written in the repository."))
    webhook = settings.PROVIDER_WEBHOOK_SECRET or ""
    if not webhook:
        problems.append(("console.E006", "PROVIDER_WEBHOOK_SECRET is empty: anyone can sign a provider event."))
    elif webhook == SANDBOX_WEBHOOK_SECRET:
        problems.append(
            (
                "console.E006",
                f"PROVIDER_WEBHOOK_SECRET is the sandbox's public secret ({webhook}): anyone can sign a "
                "provider event, e.g. book a refund that never happened.",
            )
        )
    return problems


def refuse_known_secrets() -> None:
    """Called where the web process starts (the WSGI application, for gunicorn, any WSGI server
    and runserver alike): with DEBUG off, a secret everyone knows stops the start instead of
    serving. The web process is the one that signs sessions and checks provider events; the
    workers use neither secret."""
    if settings.DEBUG:
        return
    problems = known_secret_problems()
    if problems:
        raise ImproperlyConfigured(
            "The console refuses to start with DEBUG off: "
            + " ".join(message for _, message in problems)
            + " Set each from the environment (console/deploy/console.env lists them)."
        )


@register(Tags.security, deploy=True)
def known_secrets_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Production must not run on a secret that this repository publishes."""
    return [
        Error(message, hint="Set it to a long random value from the environment.", id=check_id)
        for check_id, message in known_secret_problems()
    ]


def _error_if(failing: bool, message: str, *, hint: str, id: str) -> list[CheckMessage]:
    """One deploy check's answer: its error when the setting fails it, else nothing."""
    return [Error(message, hint=hint, id=id)] if failing else []


@register(Tags.security, deploy=True)
def webhook_loopback_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Agents choose their webhook's address; loopback is for tests and a one-machine demo."""
    return _error_if(
        settings.AGENT_WEBHOOK_ALLOW_LOOPBACK,
        "AGENT_WEBHOOK_ALLOW_LOOPBACK is on: an agent's owner can make the console post to services "
        "on its own machine.",
        hint="Unset AGENT_WEBHOOK_ALLOW_LOOPBACK in production.",
        id="console.E007",
    )


@register(Tags.security, deploy=True)
def metrics_token_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """/metrics must not be open to anyone in production: it tells an outsider how many
    refunds are stuck and for how long, which is worth knowing before an attack."""
    token = settings.METRICS_TOKEN
    if not token:
        return [
            Error(
                "METRICS_TOKEN is empty: /metrics is open to anyone outside production mode, and refuses every "
                "scraper in it.",
                hint="Set METRICS_TOKEN to a long random value and give it to the metrics scraper.",
                id="console.E001",
            )
        ]
    return _error_if(
        len(token) < 32,
        "METRICS_TOKEN is shorter than 32 characters.",
        hint="Use a long random value, e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
        id="console.E002",
    )


@register(Tags.security, deploy=True)
def production_mode_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A deployment checked with --deploy is a production one: the demo conveniences (orders
    typed in the admin, open metrics) must be off."""
    return _error_if(
        not settings.PRODUCTION_MODE,
        "PRODUCTION_MODE is off: admins may create orders by hand and /metrics may be open.",
        hint="Unset PRODUCTION_MODE (it follows DEBUG) or set PRODUCTION_MODE=1.",
        id="console.E003",
    )


@register(Tags.security, deploy=True)
def trail_signing_key_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Without its key no checkpoint of the audit trail can be signed or checked (docs/evidence.md)."""
    key = settings.TRAIL_SIGNING_KEY
    return _error_if(
        not key or key == settings.TRAIL_DEMO_SIGNING_KEY or len(key) < 32,
        "TRAIL_SIGNING_KEY is missing, too short or the demo key: the audit trail's checkpoints cannot be signed.",
        hint="Set TRAIL_SIGNING_KEY to a random value of at least 32 characters, kept outside the "
        "database, and give it to the auditors who verify evidence bundles.",
        id="console.E008",
    )


@register()
def receiver_rate_limits_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Limits the `limits` library cannot read, or kept per process where every process must share them."""
    from actions.engine.throttle import rate_limit_problems, rate_limit_store_is_shared

    messages: list[CheckMessage] = []
    if settings.RECEIVER_RATE_LIMITS and not rate_limit_store_is_shared():
        messages.append(
            Error(
                "RECEIVER_RATE_LIMITS is set but RECEIVER_RATE_LIMIT_STORAGE is a per-process store "
                f"({settings.RECEIVER_RATE_LIMIT_STORAGE}): every worker process would get the whole limit.",
                hint="Point RECEIVER_RATE_LIMIT_STORAGE at a shared store (redis://...), or use a Redis broker, "
                "whose URL it then defaults to.",
                id="console.E009",
            )
        )
    problems = rate_limit_problems()
    if problems:
        messages.append(
            Error(
                f"RECEIVER_RATE_LIMITS has limits that cannot be read: {', '.join(problems)}.",
                hint='Write each as name=N/second (or /minute, /hour), separated by ";", e.g. '
                '"provider=100/second;accounting system=60/minute".',
                id="console.E004",
            )
        )
    return messages
