"""Notifications: sent once per item and person, as each person chose; the navigation's count;
the choices on the account page."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.test import Client
from django.utils import timezone

from actions.models import Action, Discrepancy, DiscrepancyKind, NotificationSent, Remedy, UserSettings
from actions.notifications import notifications_send_due, waiting_count_for
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


class FailingBackend(BaseEmailBackend):
    def send_messages(self, email_messages: Any) -> int:
        raise ConnectionRefusedError("the mail relay is down")


@pytest.fixture(autouse=True)
def outbox(settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    mail.outbox = []
    return mail.outbox


def _age(action: Action, minutes: int) -> None:
    Action.objects.filter(pk=action.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))


def _words(action: Action) -> str:
    """How the mail names an action: what a clerk knows it by."""
    order = action.order
    assert order is not None
    return f"Refund · {action.amount} {action.currency} · Order {order.number} · {order.customer_name}"


def _link(action: Action, where: str) -> str:
    return f"/{where}/{action.pk}/"


def _escalate(action: Action, owner: Any, *, due_in: timedelta) -> None:
    Action.objects.filter(pk=action.pk).update(status="NEEDS_REVIEW", owner=owner, due_at=timezone.now() + due_in)


def test_a_manager_is_told_once_of_proposals_waiting_beyond_their_limit(
    manager: Any, second_manager: Any, agent_actor: Actor, outbox: list[Any]
) -> None:
    UserSettings.objects.create(user=second_manager, notify_waiting_proposals=False)
    old = propose(agent_actor, amount="20.00")
    young = propose(agent_actor, amount="21.00")
    _age(old, 45)
    _age(young, 5)

    notifications_send_due()
    [message] = outbox
    assert message.to == [manager.email]
    assert _words(old) in message.body and _words(young) not in message.body
    assert _link(old, "approvals") in message.body

    # A second beat (or one that runs twice) sends nothing more.
    notifications_send_due()
    assert len(outbox) == 1

    # Later the younger one passes the limit too: a mail about it alone.
    notifications_send_due(now=timezone.now() + timedelta(minutes=40))
    assert len(outbox) == 2
    assert _words(young) in outbox[1].body and _words(old) not in outbox[1].body
    assert NotificationSent.objects.filter(user=second_manager).count() == 0


def test_the_waiting_limit_is_each_managers_own(manager: Any, agent_actor: Actor, outbox: list[Any]) -> None:
    UserSettings.objects.create(user=manager, waiting_minutes=120)
    action = propose(agent_actor)
    _age(action, 45)
    notifications_send_due()
    assert outbox == []
    notifications_send_due(now=timezone.now() + timedelta(minutes=80))
    assert len(outbox) == 1


def test_an_owner_is_told_of_an_escalation_once_and_again_when_it_is_overdue(
    finance: Any, agent_actor: Actor, outbox: list[Any]
) -> None:
    action = propose(agent_actor)
    _escalate(action, finance, due_in=timedelta(hours=24))
    notifications_send_due()
    [escalated] = outbox
    assert escalated.to == [finance.email] and "escalated" in escalated.subject
    assert _words(action) in escalated.body and _link(action, "review/actions") in escalated.body
    # The action's id is a technical detail: its page says it, the mail does not lead with it.
    assert action.action_id not in escalated.body
    notifications_send_due()
    assert len(outbox) == 1

    later = timezone.now() + timedelta(hours=25)
    notifications_send_due(now=later)
    assert len(outbox) == 2 and "overdue" in outbox[1].subject
    notifications_send_due(now=later + timedelta(minutes=1))
    assert len(outbox) == 2


def test_remedies_and_discrepancies_count_as_owned_items(finance: Any, agent_actor: Actor, outbox: list[Any]) -> None:
    action = propose(agent_actor)
    remedy = Remedy.objects.create(action=action, amount=Decimal("10.00"), currency="EUR", owner=finance)
    found = Discrepancy.objects.create(kind=DiscrepancyKind.AMOUNT_MISMATCH, action=action, owner=finance)
    notifications_send_due()
    [message] = outbox
    assert f"Remedy of 10.00 EUR for: {_words(action)}" in message.body
    assert f"Discrepancy: Amount or currency differs · {_words(action)}" in message.body
    assert action.action_id not in message.body
    subjects = set(NotificationSent.objects.filter(user=finance).values_list("subject", flat=True))
    assert subjects == {f"remedy:{remedy.pk}", f"discrepancy:{found.pk}"}
    assert waiting_count_for(finance, {"finance"}) == 2


def test_an_owner_who_opted_out_is_not_told(finance: Any, agent_actor: Actor, outbox: list[Any]) -> None:
    UserSettings.objects.create(user=finance, notify_escalations=False, notify_overdue=False)
    action = propose(agent_actor)
    _escalate(action, finance, due_in=timedelta(hours=-1))
    notifications_send_due()
    assert outbox == []


def test_a_mail_that_cannot_be_sent_is_tried_again_by_the_next_run(
    finance: Any, agent_actor: Actor, outbox: list[Any], settings: Any
) -> None:
    action = propose(agent_actor)
    _escalate(action, finance, due_in=timedelta(hours=24))
    settings.NOTIFICATION_EMAIL_BACKEND = f"{__name__}.FailingBackend"
    with pytest.raises(ConnectionRefusedError):
        notifications_send_due()
    assert not NotificationSent.objects.exists()
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    notifications_send_due()
    assert len(outbox) == 1


def test_the_navigation_shows_how_many_items_wait_for_this_person(
    manager: Any, finance: Any, agent_actor: Actor
) -> None:
    first, second = propose(agent_actor), propose(agent_actor)
    _escalate(first, finance, due_in=timedelta(hours=1))
    client = Client()
    client.login(username=manager.username, password=PASSWORD)
    page = client.get("/").content.decode()
    # One proposal left (the other was escalated away from PROPOSED).
    assert 'data-testid="nav-waiting"' in page and "1 waiting for you" in page
    client.login(username=finance.username, password=PASSWORD)
    assert "1 waiting for you" in client.get("/").content.decode()
    Action.objects.filter(pk=second.pk).update(status="CANCELLED")
    client.login(username=manager.username, password=PASSWORD)
    assert 'data-testid="nav-waiting"' not in client.get("/").content.decode()


def test_each_person_chooses_their_notifications_on_the_account_page(manager: Any) -> None:
    UserSettings.objects.create(user=manager, time_zone="Europe/Berlin")
    client = Client()
    client.login(username=manager.username, password=PASSWORD)
    page = client.get("/account/").content.decode()
    assert 'data-testid="notification-settings"' in page
    assert "Proposals waiting for a manager" in page

    bad = client.post("/account/notifications", {"waiting_minutes": "0", "notify_overdue": "on"})
    assert bad.status_code == 400
    assert "Enter at least 1 minute." in bad.content.decode()
    assert UserSettings.objects.get(user=manager).notify_overdue is True
    assert UserSettings.objects.get(user=manager).notify_escalations is True

    good = client.post("/account/notifications", {"waiting_minutes": "15", "notify_overdue": "on"})
    assert good.status_code == 302
    saved = UserSettings.objects.get(user=manager)
    assert (saved.waiting_minutes, saved.notify_escalations, saved.notify_overdue) == (15, False, True)
    assert saved.notify_waiting_proposals is False
    # Only its own columns: the time zone chosen elsewhere on the page is kept.
    assert saved.time_zone == "Europe/Berlin"


def test_a_non_manager_is_not_offered_the_managers_choices(finance: Any) -> None:
    client = Client()
    client.login(username=finance.username, password=PASSWORD)
    page = client.get("/account/").content.decode()
    assert "Proposals waiting for a manager" not in page
    assert 'name="waiting_minutes"' not in page
    # Posting them anyway changes nothing of them: only the choices offered are saved.
    answer = client.post("/account/notifications", {"waiting_minutes": "0", "notify_escalations": "on"})
    assert answer.status_code == 302
    saved = UserSettings.objects.get(user=finance)
    assert (saved.notify_waiting_proposals, saved.waiting_minutes) == (True, 30)
    assert (saved.notify_escalations, saved.notify_overdue) == (True, False)


def test_the_notification_form_needs_a_login_and_csrf(finance: Any) -> None:
    assert Client().post("/account/notifications", {"waiting_minutes": "15"}).status_code == 302
    strict = Client(enforce_csrf_checks=True)
    strict.login(username=finance.username, password=PASSWORD)
    assert strict.post("/account/notifications", {"waiting_minutes": "15"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_send_one_mail(finance: Any, agent_actor: Actor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second run's insert waits on the first run's uncommitted row, then finds it: the mail
    goes once. The first run holds its mail until PostgreSQL shows the second one waiting."""
    import threading

    from django.db import connection

    from tests.processes import wait_until

    action = propose(agent_actor)
    _escalate(action, finance, due_in=timedelta(hours=24))
    first_sending = threading.Event()
    real_send = mail.EmailMessage.send

    def held_send(message: Any, *args: Any, **kwargs: Any) -> int:
        if not first_sending.is_set():
            first_sending.set()

            def other_waits() -> bool:
                with connection.cursor() as cursor:
                    # Inside a transaction the statistics views keep their first snapshot.
                    cursor.execute("SELECT pg_stat_clear_snapshot()")
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                    return cursor.fetchone()[0] > 0

            wait_until(other_waits, timeout=20, what="the second run to wait on the first one's row")
        return real_send(message, *args, **kwargs)

    monkeypatch.setattr(mail.EmailMessage, "send", held_send)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            notifications_send_due()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    first = threading.Thread(target=run)
    first.start()
    assert first_sending.wait(timeout=20)
    second = threading.Thread(target=run)
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    assert not errors
    assert len(mail.outbox) == 1
    assert NotificationSent.objects.filter(user=finance).count() == 1
