"""In the demo, notifications go to the mail sandbox by SMTP; its inbox pages show them to a
person, escaped; the supplier emails' audit does not count them as supplier emails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import requests
from django.core.mail import EmailMultiAlternatives
from django.utils import timezone

from actions.kinds.supplier_email.contract import MailRelay
from actions.models import Action
from actions.notifications import notifications_send_due
from actions.providers.mail.smtp import SmtpMailer
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.mail import MailSandboxClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def smtp_notifications(mail_sandbox: MailSandboxClient, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.CONSOLE_BASE_URL = "http://127.0.0.1:18000"
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    return mail_sandbox


def test_a_notification_reaches_the_sandbox_and_its_inbox_shows_it_with_its_link(
    smtp_notifications: MailSandboxClient, finance: Any, agent_actor: Actor
) -> None:
    action = propose(agent_actor)
    Action.objects.filter(pk=action.pk).update(
        status="NEEDS_REVIEW", owner=finance, due_at=timezone.now() + timedelta(hours=4)
    )
    notifications_send_due()
    [row] = smtp_notifications.messages()
    assert row["rcpt_to"] == finance.email and "escalated" in row["subject"]

    inbox = requests.get(f"{smtp_notifications.url}/", timeout=5)
    assert inbox.status_code == 200 and inbox.headers["Content-Type"].startswith("text/html")
    assert f'href="/messages/{row["id"]}"' in inbox.text and "escalated to you" in inbox.text

    page = requests.get(f"{smtp_notifications.url}/messages/{row['id']}", timeout=5).text
    link = f"http://127.0.0.1:18000/review/actions/{action.pk}/"
    assert f'<a href="{link}">{link}</a>' in page
    assert f'src="/messages/{row["id"]}/html"' in page
    html_part = requests.get(f"{smtp_notifications.url}/messages/{row['id']}/html", timeout=5).text
    assert f'href="{link}"' in html_part

    # The supplier emails' ledger is the same sandbox: the notification is not an effect of theirs.
    receiver = MailRelay(SmtpMailer(timeout_seconds=5), smtp_notifications.url)
    assert list(receiver.ledger()) == []


def test_the_inbox_escapes_what_a_message_says(smtp_notifications: MailSandboxClient, settings: Any) -> None:
    message = EmailMultiAlternatives(
        subject='<script>alert("s")</script>',
        body='<img src=x onerror=alert(1)> see http://x.test/"><script>',
        from_email="evil@example.com",
        to=["ann@example.com"],
    )
    message.attach_alternative("<p onclick=x>hi</p><script>alert(2)</script>", "text/html")
    message.send()
    [row] = smtp_notifications.messages()
    inbox = requests.get(f"{smtp_notifications.url}/", timeout=5)
    assert "<script>" not in inbox.text and "&lt;script&gt;" in inbox.text
    page = requests.get(f"{smtp_notifications.url}/messages/{row['id']}", timeout=5)
    assert "<script>" not in page.text and "<img" not in page.text
    assert '<a href="http://x.test/">http://x.test/</a>&quot;&gt;&lt;script&gt;' in page.text
    # The HTML part is served as sent, to a sandboxed frame, under a policy that runs no script.
    frame = requests.get(f"{smtp_notifications.url}/messages/{row['id']}/html", timeout=5)
    assert "default-src 'none'" in frame.headers["Content-Security-Policy"]
    assert 'sandbox="allow-popups allow-popups-to-escape-sandbox"' in page.text
    assert requests.get(f"{smtp_notifications.url}/messages/999999", timeout=5).status_code == 404
    assert requests.get(f"{smtp_notifications.url}/messages", timeout=5).json()["messages"][0]["id"] == row["id"]
