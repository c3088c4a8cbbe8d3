"""Finding 8: CSP, Permissions-Policy, no-store on private answers, /metrics closed in production."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from actions.agents.services import agent_token_issue
from console.checks import metrics_token_check

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_console_and_admin_pages_send_a_strict_csp_and_permissions_policy(manager: Any, console_admin: Any) -> None:
    for user, url in ((manager, "/approvals/"), (console_admin, "/admin/"), (None, "/login/")):
        client = Client()
        if user is not None:
            client.force_login(user)
        response = client.get(url)
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp, url
        assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp, url
        assert "frame-ancestors 'none'" in csp
        assert "camera=()" in response["Permissions-Policy"]


def test_no_template_has_an_inline_script_style_or_event_handler() -> None:
    inline = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=|\son[a-z]+=|hx-on[:-]|javascript:", re.I)
    offenders = [
        f"{path.relative_to(TEMPLATES)}: {match.group(0)}"
        for path in TEMPLATES.rglob("*.html")
        for match in inline.finditer(path.read_text())
    ]
    assert offenders == []


def test_htmx_is_configured_for_the_policy(manager: Any) -> None:
    client = Client()
    client.force_login(manager)
    page = client.get("/approvals/").content.decode()
    assert '"allowEval": false' in page
    assert '"includeIndicatorStyles": false' in page


def test_private_pages_and_api_answers_are_not_stored(manager: Any, api_token: str) -> None:
    client = Client()
    client.force_login(manager)
    page = client.get("/approvals/")
    api = Client().get("/api/v1/actions", headers={"Authorization": f"Bearer {api_token}"})
    public = Client().get("/static/console/console.css")

    assert "no-store" in page["Cache-Control"]
    assert "no-store" in api["Cache-Control"]
    assert "no-store" not in public.get("Cache-Control", "")


@pytest.fixture
def api_token(agent: Any) -> str:
    return agent_token_issue(agent=agent).plain


def test_metrics_refuse_everyone_in_production_mode_without_a_token(settings: Any) -> None:
    settings.PRODUCTION_MODE = True
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 401


def test_metrics_need_the_token_when_one_is_set(settings: Any) -> None:
    settings.METRICS_TOKEN = "m" * 40
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", headers={"Authorization": f"Bearer {'m' * 40}"}).status_code == 200


def test_check_deploy_fails_while_metrics_are_open(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert [message.id for message in metrics_token_check()] == ["console.E001"]
    with pytest.raises(SystemCheckError, match=r"console\.E001"):
        call_command("check", "--deploy", stdout=StringIO(), stderr=StringIO())
    settings.METRICS_TOKEN = "a-long-random-scraper-token-of-forty-chars"
    assert metrics_token_check() == []
