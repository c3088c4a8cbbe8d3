"""Step-up: approving above the configured amount needs a TOTP code confirmed within minutes.

A stolen password alone no longer approves a high-value refund (ASVS: high-value business
actions need a second factor).
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from actions.models import ActionStatus
from actions.services import Actor
from approvals.step_up import STEP_UP_SESSION_KEY, step_up_refusal
from tests.approvals.test_views import shown_now
from tests.factories import make_order
from tests.security.conftest import propose

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def step_up_above_100(settings: Any) -> None:
    settings.STEP_UP_THRESHOLDS = {"EUR": Decimal("100")}
    settings.AUTO_APPROVAL_ENABLED = False


def current_code(device: TOTPDevice) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits, drift=device.drift):06d}"


def test_the_rule_needs_a_confirmed_device_and_a_recent_code(manager: Any) -> None:
    now = time.time()
    small = step_up_refusal(user=manager, amount=Decimal("100"), currency="EUR", verified_at=None, now=now)
    no_device = step_up_refusal(user=manager, amount=Decimal("100.01"), currency="EUR", verified_at=now, now=now)
    TOTPDevice.objects.create(user=manager, name="app", confirmed=True)
    stale = step_up_refusal(user=manager, amount=Decimal("500"), currency="EUR", verified_at=now - 301, now=now)
    fresh = step_up_refusal(user=manager, amount=Decimal("500"), currency="EUR", verified_at=now - 60, now=now)

    assert small is None
    assert no_device is not None and "authenticator" in no_device
    assert stale is not None and "5 minutes" in stale
    assert fresh is None


def test_approving_above_the_amount_without_a_code_changes_nothing(manager: Any, agent: Any) -> None:
    TOTPDevice.objects.create(user=manager, name="app", confirmed=True)
    action = propose(Actor.for_agent(agent), amount="150.00", order=make_order(captured="1000.00"))
    client = Client()
    client.force_login(manager)

    decision = {"decision": "approve", **shown_now(action)}
    plain = client.post(f"/approvals/{action.pk}/decide", decision)
    htmx = client.post(f"/approvals/{action.pk}/decide", decision, headers={"HX-Request": "true"})

    assert plain.status_code == 302 and plain["Location"].startswith("/account/verify/")
    assert htmx.status_code == 403 and htmx["HX-Redirect"].startswith("/account/verify/")
    action.refresh_from_db()
    assert action.status == ActionStatus.PROPOSED


def test_a_confirmed_code_lets_the_manager_approve(manager: Any, agent: Any) -> None:
    device = TOTPDevice.objects.create(user=manager, name="app", confirmed=True)
    action = propose(Actor.for_agent(agent), amount="150.00", order=make_order(captured="1000.00"))
    client = Client()
    client.force_login(manager)

    wrong = client.post("/account/verify/", {"code": "000000", "next": f"/approvals/{action.pk}/"})
    assert wrong.status_code == 200
    assert STEP_UP_SESSION_KEY not in client.session
    # django-otp slows down guessing after a failure; the test does not wait for that.
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_count=0, throttling_failure_timestamp=None)
    device.refresh_from_db()
    right = client.post("/account/verify/", {"code": current_code(device), "next": f"/approvals/{action.pk}/"})
    approved = client.post(f"/approvals/{action.pk}/decide", {"decision": "approve", **shown_now(action)})

    assert right.status_code == 302 and right["Location"] == f"/approvals/{action.pk}/"
    assert approved.status_code == 302
    action.refresh_from_db()
    assert action.status == ActionStatus.AUTHORIZED


def test_a_code_is_not_accepted_twice(manager: Any) -> None:
    device = TOTPDevice.objects.create(user=manager, name="app", confirmed=True)
    code = current_code(device)
    client = Client()
    client.force_login(manager)

    first = client.post("/account/verify/", {"code": code})
    again = Client()
    again.force_login(manager)
    replay = again.post("/account/verify/", {"code": code})

    assert first.status_code == 302
    assert replay.status_code == 200  # the form again: the code was used
    assert STEP_UP_SESSION_KEY not in again.session


def test_a_person_sets_up_an_authenticator_app(manager: Any) -> None:
    client = Client()
    client.force_login(manager)
    page = client.get("/account/two-factor/")
    device = TOTPDevice.objects.get(user=manager, confirmed=False)

    confirmed = client.post("/account/two-factor/", {"code": current_code(device)})

    assert page.status_code == 200 and b"<svg" in page.content and b"style=" not in page.content
    assert confirmed.status_code == 302
    assert TOTPDevice.objects.get(user=manager).confirmed
