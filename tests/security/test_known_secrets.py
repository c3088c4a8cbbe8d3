"""Production refuses the secrets this repository publishes: the development SECRET_KEY, the
sandbox's webhook secret, and empty ones. `check --deploy` names each, and with DEBUG off the
web process does not start on them."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from console.checks import DEVELOPMENT_SECRET_KEY, known_secrets_check, webhook_loopback_check

REPO_ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "a-long-random-looking-secret-key-for-the-known-secrets-test-0123456789"
GOOD_HOOK = "whsec_a_long_random_looking_endpoint_secret_for_the_test"


@pytest.mark.parametrize(
    ("key", "hook", "ids"),
    [
        (DEVELOPMENT_SECRET_KEY, GOOD_HOOK, ["console.E005"]),
        ("", GOOD_HOOK, ["console.E005"]),
        (GOOD_KEY, "whsec_sandbox", ["console.E006"]),
        (GOOD_KEY, "", ["console.E006"]),
        (DEVELOPMENT_SECRET_KEY, "whsec_sandbox", ["console.E005", "console.E006"]),
        (GOOD_KEY, GOOD_HOOK, []),
    ],
)
def test_check_deploy_names_each_known_or_empty_secret(settings: Any, key: str, hook: str, ids: list[str]) -> None:
    settings.SECRET_KEY = key
    settings.PROVIDER_WEBHOOK_SECRET = hook
    assert [message.id for message in known_secrets_check()] == ids


def test_check_deploy_fails_on_the_sandbox_webhook_secret_and_names_the_setting(settings: Any) -> None:
    settings.SECRET_KEY = GOOD_KEY
    settings.METRICS_TOKEN = "a-long-random-scraper-token-of-forty-chars"
    settings.PROVIDER_WEBHOOK_SECRET = "whsec_sandbox"
    with pytest.raises(SystemCheckError, match=r"PROVIDER_WEBHOOK_SECRET"):
        call_command("check", "--deploy", stdout=StringIO(), stderr=StringIO())


def test_check_deploy_reports_webhooks_allowed_to_loopback(settings: Any) -> None:
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    assert [message.id for message in webhook_loopback_check()] == ["console.E007"]
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = False
    assert webhook_loopback_check() == []


def _start_web(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Load the WSGI application in a fresh process, as gunicorn does."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SECRET_KEY", "PROVIDER_WEBHOOK_SECRET", "DEBUG", "DATABASE_URL")
    }
    environment.update({"CONSOLE_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT), **env})
    return subprocess.run(
        [sys.executable, "-c", "import console.wsgi"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_with_debug_off_the_web_process_does_not_start_on_the_sandbox_secret(tmp_path: Path) -> None:
    refused = _start_web(tmp_path, DEBUG="0", SECRET_KEY=GOOD_KEY, PROVIDER_WEBHOOK_SECRET="whsec_sandbox")
    assert refused.returncode != 0
    assert "refuses to start" in refused.stderr and "PROVIDER_WEBHOOK_SECRET" in refused.stderr


def test_with_debug_off_the_web_process_does_not_start_on_the_development_key(tmp_path: Path) -> None:
    refused = _start_web(tmp_path, DEBUG="0", PROVIDER_WEBHOOK_SECRET=GOOD_HOOK)
    assert refused.returncode != 0
    assert "refuses to start" in refused.stderr and "SECRET_KEY" in refused.stderr


def test_the_web_process_starts_with_its_own_secrets_or_in_debug(tmp_path: Path) -> None:
    started = _start_web(tmp_path, DEBUG="0", SECRET_KEY=GOOD_KEY, PROVIDER_WEBHOOK_SECRET=GOOD_HOOK)
    assert started.returncode == 0, started.stderr
    development = _start_web(tmp_path, DEBUG="1")
    assert development.returncode == 0, development.stderr
