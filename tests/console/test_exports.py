"""Finance's CSV exports: permissions, date ranges, and formula cells neutralised."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from actions.foundation.trail import event_record
from actions.models import Action, ActionEvent
from actions.review.exports import csv_safe
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def _client(user: Any) -> Client:
    client = Client()
    client.login(username=user.username, password=PASSWORD)
    return client


def _rows(response: Any) -> list[list[str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_cells_that_a_spreadsheet_would_run_start_with_an_apostrophe() -> None:
    assert [csv_safe(v) for v in ("=1+1", "+33", "-2", "@SUM(A1)", "\tx", "plain", None, 5)] == [
        "'=1+1",
        "'+33",
        "'-2",
        "'@SUM(A1)",
        "'\tx",
        "plain",
        "",
        "5",
    ]


def test_finance_exports_the_actions_and_the_trail_of_a_date_range(finance: Any, agent_actor: Actor) -> None:
    today = timezone.localdate()
    inside = propose(agent_actor)
    outside = propose(agent_actor)
    Action.objects.filter(pk=outside.pk).update(created_at=timezone.now() - timedelta(days=40))
    client = _client(finance)

    answer = client.get("/exports/actions.csv", {"start": today.isoformat(), "end": today.isoformat()})
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert f'filename="actions_{today}_{today}.csv"' in answer["Content-Disposition"]
    rows = _rows(answer)
    assert rows[0][0] == "action_id"
    assert [row[0] for row in rows[1:]] == [inside.action_id]

    # A person's note in the trail (an approval note, say) that a spreadsheet would run.
    with transaction.atomic():
        event_record(
            action=inside,
            transition="note",
            from_state=inside.status,
            actor=Actor.system("test"),
            reason='=HYPERLINK("http://evil.example","click")',
        )
    trail = _rows(client.get("/exports/audit-trail.csv", {"start": today.isoformat(), "end": today.isoformat()}))
    events = {row[2] for row in trail[1:]}
    assert inside.action_id in events
    assert '\'=HYPERLINK("http://evil.example","click")' in [row[7] for row in trail[1:]]
    for row in trail[1:]:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@"))
    assert ActionEvent.objects.filter(action=inside).exists()


def test_a_bad_range_is_refused_with_the_reason_and_no_file(finance: Any) -> None:
    client = _client(finance)
    cases = {
        ("2026-13-01", "2026-12-31"): "is not a date like",
        ("2026-02-01", "2026-01-01"): "before the start date",
        ("2024-01-01", "2026-01-01"): "at most 366 days",
        ("", ""): "is not a date like",
    }
    for (start, end), reason in cases.items():
        answer = client.get("/exports/actions.csv", {"start": start, "end": end})
        assert answer.status_code == 400, (start, end)
        assert reason in answer.content.decode()
        assert answer["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("role_user", ["manager", "agent_owner", "second_manager"])
def test_people_outside_finance_and_admin_cannot_export(role_user: str, request: pytest.FixtureRequest) -> None:
    client = _client(request.getfixturevalue(role_user))
    for url in ("/exports/", "/exports/actions.csv", "/exports/audit-trail.csv"):
        assert client.get(url, {"start": "2026-01-01", "end": "2026-01-02"}).status_code == 403


def test_admins_may_export_and_anonymous_people_are_sent_to_log_in(console_admin: Any) -> None:
    assert _client(console_admin).get("/exports/").status_code == 200
    assert Client().get("/exports/actions.csv").status_code == 302
