"""A discrepancy the audit found with no action behind it (a refund made by hand at the
provider) can be opened and worked by finance: its page and every step answer, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from actions.models import Discrepancy, DiscrepancyKind

pytestmark = pytest.mark.django_db


@pytest.fixture
def stray(db: Any) -> Discrepancy:
    # As the audit records it: what the provider reported, and no action.
    return Discrepancy.objects.create(
        kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION,
        provider_reference="re_by_hand",
        details={"metadata_action_id": None, "amount_minor": 1500, "currency": "EUR"},
    )


def test_the_page_of_an_effect_with_no_action_shows_its_money(client: Client, finance: Any, stray: Discrepancy) -> None:
    client.force_login(finance)
    page = client.get(reverse("review-discrepancy", args=[stray.pk]))
    assert page.status_code == 200
    assert "15.00" in page.content.decode() and "EUR" in page.content.decode()


def test_a_discrepancy_recorded_before_the_currency_was_kept_still_opens(client: Client, finance: Any) -> None:
    older = Discrepancy.objects.create(
        kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION,
        provider_reference="re_older",
        details={"metadata_action_id": None, "amount_minor": 1500},
    )
    client.force_login(finance)
    assert client.get(reverse("review-discrepancy", args=[older.pk])).status_code == 200


@pytest.mark.parametrize("htmx", [False, True])
def test_every_step_of_its_workflow_answers(client: Client, finance: Any, stray: Discrepancy, htmx: bool) -> None:
    client.force_login(finance)
    headers = {"HX-Request": "true"} if htmx else {}
    advance = reverse("review-discrepancy-advance", args=[stray.pk])
    taken = client.post(reverse("review-discrepancy-assign", args=[stray.pk]), {"origin": "detail"}, headers=headers)
    assert taken.status_code in (200, 302)
    started = client.post(advance, {"status": "in_progress", "origin": "detail"}, headers=headers)
    assert started.status_code in (200, 302)
    refused = client.post(advance, {"status": "explained", "origin": "detail"}, headers=headers)
    assert refused.status_code == 400
    explained = client.post(
        advance,
        {"status": "explained", "note": "Refunded by hand at the provider.", "origin": "detail"},
        headers=headers,
    )
    assert explained.status_code in (200, 302)
    stray.refresh_from_db()
    assert (stray.status, stray.owner) == ("explained", finance)
