"""The ledger audit sees a refund for an action the console holds as not succeeded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from actions.engine.ledger import ledger_compare
from actions.kinds import kind_for
from actions.kinds.base import LedgerWindow
from actions.kinds.refund.contract import effect_from_refund
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, DiscrepancyKind
from actions.providers.base import ProviderRefund, RefundStatus
from actions.services import Actor, action_transition
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

# One window over all time: these tests are about what is judged, not where windows fall.
EVERY_EFFECT = LedgerWindow(start=None, end=timezone.now() + timedelta(days=3650))


def refund_for(action: Action, *, reference: str, status: RefundStatus = RefundStatus.SUCCEEDED) -> ProviderRefund:
    return ProviderRefund(
        id=reference,
        charge=action.payload["charge"],
        amount_minor=2000,
        currency="eur",
        status=status,
        metadata={"action_id": action.action_id},
        created=0,
        raw={},
    )


def proposed(agent_actor: Actor, settings: Any) -> Action:
    settings.AUTO_APPROVAL_ENABLED = False
    order = make_order(captured="100.00")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="20.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action


def test_a_refund_for_a_cancelled_action_is_a_discrepancy(agent_actor: Actor, settings: Any) -> None:
    """Invariant 1: money moved although the console holds that nothing did (a remedy or a new
    request could pay the customer a second time)."""
    action = proposed(agent_actor, settings)
    with transaction.atomic():
        action_transition(action=Action.objects.get(pk=action.pk), transition="cancel", actor=Actor.system("test"))

    result = ledger_compare(
        kind=kind_for("refund"),
        effects=[effect_from_refund(refund_for(action, reference="re_stray"))],
        window=EVERY_EFFECT,
        judged_before=timezone.now(),
    )

    assert [(f.kind, f.provider_reference) for f in result.findings] == [
        (DiscrepancyKind.EFFECT_FOR_UNSUCCESSFUL_ACTION, "re_stray")
    ]


def test_a_failed_refund_for_a_cancelled_action_is_not_an_effect(agent_actor: Actor, settings: Any) -> None:
    action = proposed(agent_actor, settings)
    with transaction.atomic():
        action_transition(action=Action.objects.get(pk=action.pk), transition="cancel", actor=Actor.system("test"))

    failed = refund_for(action, reference="re_failed", status=RefundStatus.FAILED)
    result = ledger_compare(
        kind=kind_for("refund"), effects=[effect_from_refund(failed)], window=EVERY_EFFECT, judged_before=timezone.now()
    )

    assert result.findings == []
