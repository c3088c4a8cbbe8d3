"""What the manager saw is what is decided.

Every decision form posts back what its page showed of the proposal: the target's version, the
amount and the payload hash. The service compares them with the locked rows in the decision's
transaction. A decision made on a page older than the proposal or its order is refused with 409,
writes nothing, and says in words what changed. The pages are tested in
test_shown_values_pages.py.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, ActionStatus, Order
from actions.provider_events.services import outside_refund_record
from actions.services import Actor
from approvals.models import ApprovalGroup, PendingRejection
from approvals.services import (
    CHANGED_SINCE_SHOWN,
    DecisionRefused,
    Shown,
    approval_decide,
    approval_decide_group,
    rejection_request,
)
from tests.approvals.test_shown_values_pages import another_refund_goes_ahead, nothing_decided
from tests.approvals.test_views import propose, shown_now
from tests.factories import make_adjustment_request, make_bill, make_order

pytestmark = pytest.mark.django_db

S = ActionStatus


@pytest.fixture(autouse=True)
def manual_decisions(settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


def shown(action: Action) -> Shown:
    """What a page opened now shows of ``action``."""
    values = shown_now(action)
    version = values["shown_version"]
    return Shown(
        version=None if version == "none" else int(version),
        amount=Decimal(values["shown_amount"]),
        payload_hash=values["shown_payload_hash"],
    )


# --- the service: a single decision -------------------------------------------------------------


def test_an_approval_on_a_page_older_than_the_order_is_refused_and_says_what_changed(
    manager: Any, second_manager: Any, agent_actor: Actor, published: list[int]
) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    on_the_page = shown(action)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")
    published.clear()

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert (refused.value.status, refused.value.code) == (409, CHANGED_SINCE_SHOWN)
    assert refused.value.message == (
        "The order changed since you opened this page: another refund of 20.00 EUR went ahead. "
        "It now has 280.00 EUR left to refund."
    )
    nothing_decided(action)
    assert published == []


def test_an_approval_with_what_the_page_showed_goes_through_and_binds_that_version(
    manager: Any, agent_actor: Actor, published: list[int]
) -> None:
    action = propose(agent_actor, amount="50.00")
    on_the_page = shown(action)

    approval = approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED
    assert (approval.order_version, approval.amount, approval.payload_hash) == (
        on_the_page.version,
        on_the_page.amount,
        on_the_page.payload_hash,
    )


def test_a_refund_made_outside_the_console_is_named_in_the_refusal(manager: Any, agent_actor: Actor) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    on_the_page = shown(action)
    refund = {"id": "re_outside_1", "status": "succeeded", "amount": 500, "currency": "eur"}
    outside_refund_record(order=order, refund=refund, event_id="evt_1", now=timezone.now())

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert refused.value.message == (
        "The order changed since you opened this page: a refund of 5.00 EUR was made outside the console. "
        "It now has 295.00 EUR left to refund."
    )
    nothing_decided(action)


def test_a_change_to_the_order_itself_is_named_in_the_refusal(manager: Any, agent_actor: Actor) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    on_the_page = shown(action)
    # The shop sends a new captured amount (actions.orders.services.order_upsert raises the version).
    Order.objects.filter(pk=order.pk).update(captured_amount=Decimal("250.00"), version=order.version + 1)

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert refused.value.message == (
        "The order changed since you opened this page: its details were changed (by the shop or a correction). "
        "It now has 250.00 EUR left to refund."
    )


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        (
            "amount",
            Decimal("40.00"),
            "The amount changed since you opened this page: it showed 40.00 EUR, the proposal now asks for 50.00 EUR.",
        ),
        ("payload_hash", "sha256:something-else", "The proposal's details changed since you opened this page."),
    ],
)
def test_a_proposal_that_differs_from_the_page_is_refused(
    manager: Any, agent_actor: Actor, field: str, value: Any, words: str
) -> None:
    action = propose(agent_actor, amount="50.00")
    on_the_page = replace(shown(action), **{field: value})

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert (refused.value.status, refused.value.message) == (409, words)
    nothing_decided(action)


def test_a_rejection_on_an_older_page_is_refused_too(manager: Any, second_manager: Any, agent_actor: Actor) -> None:
    order = make_order(captured="300.00")
    action = propose(agent_actor, amount="50.00", order=order)
    on_the_page = shown(action)
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")

    with pytest.raises(DecisionRefused) as refused:
        rejection_request(action_pk=action.pk, user=manager, reason_code="duplicate", shown=on_the_page)

    assert refused.value.status == 409
    assert "another refund of 20.00 EUR went ahead" in refused.value.message
    nothing_decided(action)
    # With what the page shows now, the rejection is asked for as before.
    rejection_request(action_pk=action.pk, user=manager, reason_code="duplicate", shown=shown(action))
    assert PendingRejection.objects.filter(action=action).exists()


def test_an_adjustment_names_the_other_adjustment_on_its_bill(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    bill = make_bill(number="INV-77", amount="200.00", amount_due="180.00")

    def adjustment(amount: str) -> Action:
        return action_propose_invoice_adjustment(
            bill_number=bill.number,
            adjustment_number=make_adjustment_request(bill).number,
            amount=amount,
            currency="EUR",
            reason_code="price_mismatch",
            evidence="PO says 18.00 a unit.",
            proposer=agent_actor,
        ).action

    action, other = adjustment("30.00"), adjustment("20.00")
    on_the_page = shown(action)
    approval_decide(action_pk=other.pk, user=second_manager, decision="approve")
    assert submission_begin(action_pk=other.pk).outcome == ClaimOutcome.CLAIMED

    with pytest.raises(DecisionRefused) as refused:
        approval_decide(action_pk=action.pk, user=manager, decision="approve", shown=on_the_page)

    assert refused.value.message == (
        "Bill INV-77 changed since you opened this page: another adjustment of 20.00 EUR went ahead. "
        "It now has 160.00 EUR left to adjust."
    )
    nothing_decided(action)


# --- the service: several proposals as one decision ----------------------------------------------


def test_a_group_on_an_older_page_is_refused_and_writes_nothing(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    order = make_order(captured="400.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    on_the_page = {a.pk: shown(a), b.pk: shown(b)}
    another_refund_goes_ahead(order, agent_actor=agent_actor, approver=second_manager, amount="20.00")

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager, shown=on_the_page)

    assert (refused.value.status, refused.value.code) == (409, CHANGED_SINCE_SHOWN)
    assert refused.value.message == (
        "The order changed since you opened this page: another refund of 20.00 EUR went ahead. "
        "It now has 380.00 EUR left to refund."
    )
    assert not ApprovalGroup.objects.exists()
    nothing_decided(a)
    nothing_decided(b)


def test_a_group_member_whose_amount_differs_is_named(manager: Any, agent_actor: Actor) -> None:
    order = make_order(captured="400.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    on_the_page = {a.pk: shown(a), b.pk: replace(shown(b), amount=Decimal("6.00"))}

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[a.pk, b.pk], user=manager, shown=on_the_page)

    assert refused.value.message == (
        f"{b.action_id}: The amount changed since you opened this page: it showed 6.00 EUR, the proposal now "
        "asks for 60.00 EUR."
    )
    assert not ApprovalGroup.objects.exists()


def test_the_group_version_chain_still_works_with_what_the_page_showed(
    manager: Any, second_manager: Any, agent_actor: Actor
) -> None:
    """Every member is shown at the one version the group card showed; the chain then lets each
    reserve after its siblings. A second group decided on the page from before the first group's
    reservations is refused, and the same group decided on a fresh page goes through."""
    order = make_order(captured="400.00")
    a, b, c, d = (propose(agent_actor, amount=amount, order=order) for amount in ("40.00", "60.00", "10.00", "15.00"))
    old_page = {pk: shown(x) for pk, x in ((a.pk, a), (b.pk, b), (c.pk, c), (d.pk, d))}
    version = old_page[a.pk].version
    assert version is not None

    decision = approval_decide_group(
        action_pks=[a.pk, b.pk], user=manager, shown={a.pk: old_page[a.pk], b.pk: old_page[b.pk]}
    )
    assert (decision.group.approved_version, decision.group.next_version) == (version, version)
    assert submission_begin(action_pk=b.pk).outcome == ClaimOutcome.CLAIMED
    assert submission_begin(action_pk=a.pk).outcome == ClaimOutcome.CLAIMED
    assert Order.objects.get(pk=order.pk).version == version + 2
    assert ApprovalGroup.objects.get().next_version == version + 2

    with pytest.raises(DecisionRefused) as refused:
        approval_decide_group(action_pks=[c.pk, d.pk], user=manager, shown={c.pk: old_page[c.pk], d.pk: old_page[d.pk]})
    # Both reservations since the page was drawn, in the order they happened (b reserved first).
    assert refused.value.message == (
        "The order changed since you opened this page: another refund of 60.00 EUR went ahead; another refund of "
        "40.00 EUR went ahead. It now has 300.00 EUR left to refund."
    )

    second = approval_decide_group(action_pks=[c.pk, d.pk], user=manager, shown={c.pk: shown(c), d.pk: shown(d)})
    assert second.group.approved_version == version + 2
    assert submission_begin(action_pk=c.pk).outcome == ClaimOutcome.CLAIMED
    assert submission_begin(action_pk=d.pk).outcome == ClaimOutcome.CLAIMED
    assert {x.status for x in Action.objects.filter(pk__in=[a.pk, b.pk, c.pk, d.pk])} == {S.SUBMITTING}
