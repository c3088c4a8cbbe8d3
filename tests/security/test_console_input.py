"""Finding 11 in the console: a person's notes cannot carry control or bidi-override characters."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from actions.models import ActionEvent, ActionStatus, Remedy
from actions.services import Actor
from tests.approvals.test_views import shown_now
from tests.security.conftest import propose

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def manual(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


def test_a_managers_note_with_a_bidi_override_is_refused(manager: Any, agent: Any) -> None:
    action = propose(Actor.for_agent(agent))
    client = Client()
    client.force_login(manager)

    response = client.post(
        f"/approvals/{action.pk}/decide", {"decision": "reject", "note": "ok \u202edesrever", **shown_now(action)}
    )

    assert response.status_code == 400
    assert "note" in response.content.decode()
    action.refresh_from_db()
    assert action.status == ActionStatus.PROPOSED


def test_a_finance_note_with_a_bell_is_refused_naming_the_field(finance: Any, agent: Any) -> None:
    action = propose(Actor.for_agent(agent))
    remedy = Remedy.objects.create(action=action, amount=Decimal("10.00"), currency="EUR")
    events = ActionEvent.objects.count()
    client = Client()
    client.force_login(finance)

    response = client.post(f"/review/remedies/{remedy.pk}/advance", {"status": "in_progress", "note": "call\u0007"})

    assert response.status_code == 400
    assert "U+0007" in response.content.decode()
    remedy.refresh_from_db()
    assert remedy.status == "open"
    assert ActionEvent.objects.count() == events
