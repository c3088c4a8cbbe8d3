"""Notifications that arrive: the same decision writes the console's row (the bell and its
list) and the e-mail, whose text and HTML parts link to the item with absolute addresses; only
the recipient sees or marks their notifications."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from actions.models import Action, Notification, NotificationSent
from actions.notifications import notifications_send_due
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def outbox(settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CONSOLE_BASE_URL = "https://console.example.test/"
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    mail.outbox = []
    return mail.outbox


def _escalate(action: Action, owner: Any) -> None:
    Action.objects.filter(pk=action.pk).update(
        status="NEEDS_REVIEW", owner=owner, due_at=timezone.now() + timedelta(hours=24)
    )


def _client(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_an_escalation_is_a_notification_in_the_console_and_an_email_with_absolute_links(
    finance: Any, agent_actor: Actor, outbox: list[Any]
) -> None:
    action = propose(agent_actor)
    _escalate(action, finance)
    notifications_send_due()

    [note] = Notification.objects.filter(recipient=finance)
    assert note.kind == "escalated" and note.read_at is None
    assert note.link == f"/review/actions/{action.pk}/"
    order = action.order
    assert order is not None
    assert note.title.startswith(f"Refund · 120.00 EUR · Order {order.number} · Ada Lovelace")
    assert action.action_id not in note.title

    [message] = outbox
    link = f"https://console.example.test/review/actions/{action.pk}/"
    assert link in message.body
    [(html, mimetype)] = message.alternatives
    assert mimetype == "text/html"
    assert f'href="{link}"' in html
    assert 'href="https://console.example.test/notifications/"' in html


def test_the_html_mail_escapes_what_it_quotes(manager: Any, agent_actor: Actor, outbox: list[Any]) -> None:
    action = propose(agent_actor)
    Action.objects.filter(pk=action.pk).update(created_at=timezone.now() - timedelta(hours=2))
    manager.username = "maria<b>"
    manager.save(update_fields=["username"])
    notifications_send_due()
    [message] = outbox
    [(html, _)] = message.alternatives
    assert "maria&lt;b&gt;" in html and "maria<b>" not in html
    assert "Hello maria<b>," in message.body  # the text part is text: nothing to escape


def test_someone_with_no_address_still_finds_the_notification_in_the_console(
    agent_actor: Actor, outbox: list[Any]
) -> None:
    owner = make_user("nora.noaddress", "finance")
    owner.email = ""
    owner.save(update_fields=["email"])
    _escalate(propose(agent_actor), owner)
    notifications_send_due()
    assert outbox == []
    assert Notification.objects.filter(recipient=owner).count() == 1
    assert NotificationSent.objects.filter(user=owner).count() == 1


def test_the_bell_counts_unread_and_the_list_marks_them_read(finance: Any, agent_actor: Actor) -> None:
    first, second = propose(agent_actor, amount="11.00"), propose(agent_actor, amount="12.00")
    _escalate(first, finance)
    _escalate(second, finance)
    notifications_send_due()
    client = _client(finance)

    home = client.get("/").content.decode()
    assert 'data-testid="nav-bell"' in home and "2 unread" in home

    page = client.get("/notifications/").content.decode()
    assert page.count('data-testid="notification"') == 2
    assert f'href="/review/actions/{first.pk}/"' in page

    note = Notification.objects.get(recipient=finance, link=f"/review/actions/{first.pk}/")
    opened = client.post(f"/notifications/{note.pk}/read", {"open": "1"})
    assert opened.status_code == 302 and opened["Location"] == f"/review/actions/{first.pk}/"
    note.refresh_from_db()
    assert note.read_at is not None
    assert "1 unread" in client.get("/").content.decode()
    assert client.get("/notifications/?show=unread").content.decode().count('data-testid="notification"') == 1

    assert client.post("/notifications/read-all").status_code == 302
    assert not Notification.objects.filter(recipient=finance, read_at__isnull=True).exists()
    assert "unread" not in client.get("/").content.decode().split('data-testid="nav-bell"')[1].split("</a>")[0]


def test_only_the_recipient_sees_or_marks_a_notification(finance: Any, manager: Any, agent_actor: Actor) -> None:
    _escalate(propose(agent_actor), finance)
    notifications_send_due()
    note = Notification.objects.get(recipient=finance)
    other = _client(manager)
    assert 'data-testid="notification"' not in other.get("/notifications/").content.decode()
    assert other.post(f"/notifications/{note.pk}/read").status_code == 404
    other.post("/notifications/read-all")
    note.refresh_from_db()
    assert note.read_at is None


def test_marking_read_needs_a_post_with_csrf_and_a_login(finance: Any, agent_actor: Actor) -> None:
    _escalate(propose(agent_actor), finance)
    notifications_send_due()
    note = Notification.objects.get(recipient=finance)
    assert Client().get("/notifications/").status_code == 302
    assert Client().post(f"/notifications/{note.pk}/read").status_code == 302
    assert _client(finance).get(f"/notifications/{note.pk}/read").status_code == 405
    assert _client(finance, enforce_csrf_checks=True).post(f"/notifications/{note.pk}/read").status_code == 403
    note.refresh_from_db()
    assert note.read_at is None


def test_the_time_zones_are_grouped_by_region(finance: Any) -> None:
    page = _client(finance).get("/account/").content.decode()
    assert '<optgroup label="Europe">' in page and '<optgroup label="America">' in page
    assert '<option value="Europe/Berlin">Berlin</option>' in page
    answer = _client(finance).post("/account/time-zone", {"time_zone": "America/Argentina/Buenos_Aires"})
    assert answer.status_code == 302
