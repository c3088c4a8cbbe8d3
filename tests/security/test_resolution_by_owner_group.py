"""Who resolves a review item: only a member of its kind's owner group, or the person it was
given to, never an admin (separation of duties).

Each kind declares its owner group (``EffectKind.owner_group``, which an admin may override per
kind with an ``OwnerGroup`` row); the five-checks page names it. Before this rule, any role with
the resolve permission resolved any kind: accounts payable recorded a refund as failed and
released its reservation, and finance could resolve invoice adjustments.

The matrix: each persona posts "record as failed" on a review item (NEEDS_REVIEW) of each kind,
through the real view. The items are owned by a colleague in the owner group, so that a cell
tests the group, not ownership. "resolves" means the action is FAILED_FINAL and its reservation
released; "403" means the page answers 403 naming the owner group, and the action, its trail,
its attempts and the money are exactly as before.

| kind                               | owner group      | finance clerk | accounts payable clerk | admin | superuser |
|------------------------------------|------------------|---------------|------------------------|-------|-----------|
| refund                             | finance          | resolves      | 403                    | 403   | 403       |
| invoice adjustment                 | accounts payable | 403           | resolves               | 403   | 403       |
| credit note void                   | accounts payable | 403           | resolves               | 403   | 403       |
| supplier email                     | finance          | resolves      | 403                    | 403   | 403       |
| customer email (a workflow's step) | finance          | resolves      | 403                    | 403   | 403       |
| compensation                       | finance          | resolves      | 403                    | 403   | 403       |

Follow-ups tied to an action are worked by that action's owner group ("advance" to in progress):

| follow-up                                  | finance clerk | accounts payable clerk | admin | superuser |
|--------------------------------------------|---------------|------------------------|-------|-----------|
| discrepancy of a refund                    | works it      | 403                    | 403   | 403       |
| discrepancy of an invoice adjustment       | 403           | works it               | 403   | 403       |
| discrepancy with no action (no kind)       | works it      | works it               | 403   | 403       |
| remedy of a refund                         | works it      | 403                    | 403   | 403       |

The receiver's live answer is stubbed: for a kind whose receiver can be asked, it holds only a
failed record for the action (so "failed" is what it proves); the others cannot be asked. A
refused attempt must not even ask it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client, override_settings
from django.urls import reverse

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.record import submission_record
from actions.kinds import kind_for
from actions.kinds.base import Answer, Effect, Lookup, LookupVerdict, Outcome, ReceiverContract
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    Bill,
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    Order,
    OwnerGroup,
    Remedy,
    Supplier,
    SupplierContact,
    Workflow,
    WorkflowState,
)
from actions.review.corrections import action_owner_assign, discrepancy_compensate
from actions.services import Actor
from actions.workflows.coordinator import workflow_advance
from actions.workflows.services import plan_decide, workflow_propose
from approvals.models import Decision
from approvals.services import approval_decide
from tests.actions.test_admin_credit_note_void import duplicate_credit_note_found, succeeded_adjustment
from tests.actions.test_corrections import duplicate_found, succeeded_refund
from tests.actions.test_reconciliation import authorized_refund
from tests.actions.test_review_reassign import reassign_options
from tests.factories import make_adjustment_request, make_bill, make_order, make_request, make_user
from tests.kinds.test_supplier_email import approved_email

pytestmark = pytest.mark.django_db

S = ActionStatus
HTMX = {"HX-Request": "true"}


class HeldForAPerson(Exception):
    """The receiver's answer that hands an action to a person (the kind's owner group)."""

    code = "held"
    http_status = None
    raw = None
    message = "The receiver's answer needs a person."


@dataclass
class OnlyAFailedRecord:
    """A receiver whose lookup finds only a failed record for the action: no effect happened."""

    contract: ReceiverContract
    asked: list[str] = field(default_factory=list)

    def lookup(self, action: Action) -> Lookup:
        self.asked.append(action.action_id)
        record = Effect(
            reference=f"rec_{action.pk}",
            status="failed",
            outcome=Outcome.FAILED_FINAL,
            amount_minor=None,
            currency=action.currency,
            action_id=action.action_id,
        )
        return Lookup(LookupVerdict.FOUND, [record])

    def send(self, action: Action) -> Answer:
        raise AssertionError(f"{action.action_id} was sent again")

    def ledger(self, window: object = None) -> Iterator[Effect]:
        return iter(())


@pytest.fixture
def receivers(monkeypatch: pytest.MonkeyPatch) -> dict[str, OnlyAFailedRecord]:
    made: dict[str, OnlyAFailedRecord] = {}

    def receiver_for(action: Action) -> OnlyAFailedRecord:
        return made.setdefault(action.kind, OnlyAFailedRecord(kind_for(action.kind).contract()))

    monkeypatch.setattr("actions.engine.resolutions.receiver_for", receiver_for)
    return made


@pytest.fixture(autouse=True)
def setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)


@pytest.fixture
def colleagues(db: Any) -> dict[str, Any]:
    """The members each owner group hands its escalations to, before the personas exist."""
    return {
        "finance": make_user("ann.finance", "finance"),
        "accounts payable": make_user("pat.payable", "accounts payable"),
    }


PERSONAS: dict[str, Callable[[], Any]] = {
    "finance clerk": lambda: make_user("fiona.finance", "finance"),
    "accounts payable clerk": lambda: make_user("alex.payable", "accounts payable"),
    "admin": lambda: make_user("adam.admin", "admin", is_staff=True),
    "superuser": lambda: make_user("root", is_staff=True, is_superuser=True),
}


# --- review items of every kind, through the real services ---------------------------------------


def needs_review(action: Action) -> Action:
    """AUTHORIZED -> SUBMITTING -> NEEDS_REVIEW, as when the receiver's answer needs a person:
    escalated to the owner group's member with the fewest open items."""
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED, claim
    assert claim.attempt is not None and claim.lease_token is not None
    submission_record(
        action_pk=action.pk,
        attempt_pk=claim.attempt.pk,
        lease_token=claim.lease_token,
        answer=Answer(outcome=Outcome.NEEDS_REVIEW, error=HeldForAPerson()),
    )
    action = Action.objects.get(pk=action.pk)
    assert action.status == S.NEEDS_REVIEW
    return action


def approved(action: Action, manager: Any) -> Action:
    if action.status == S.PROPOSED:
        approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    action = Action.objects.get(pk=action.pk)
    assert action.status == S.AUTHORIZED, action.rejection_reasons
    return action


def a_refund(agent_actor: Actor, manager: Any) -> Action:
    return authorized_refund(agent_actor)


def an_invoice_adjustment(agent_actor: Actor, manager: Any) -> Action:
    bill = make_bill(amount="200.00")
    adjustment = make_adjustment_request(bill)
    action = action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=adjustment.number,
        amount="20.00",
        currency="EUR",
        reason_code="price_mismatch",
        proposer=agent_actor,
    ).action
    return approved(action, manager)


def adjustments_duplicate_found(original: Action) -> Discrepancy:
    # The audit reads the accounting system's ledger (a fake here) only when one is configured.
    with override_settings(ACCOUNTING_API_BASE="http://accounting.invalid"):
        return duplicate_credit_note_found(original)


def a_credit_note_void(agent_actor: Actor, manager: Any) -> Action:
    original = succeeded_adjustment(agent_actor, manager)
    found = adjustments_duplicate_found(original)
    admin = make_user("void.admin", "admin", is_staff=True)
    void = discrepancy_compensate(discrepancy_pk=found.pk, user=admin, note="The second credit note is a duplicate.")
    return approved(void, manager)


def a_supplier_email(agent_actor: Actor, manager: Any) -> Action:
    acme = Supplier.objects.create(code="ACME", name="Acme Widgets")
    SupplierContact.objects.create(supplier=acme, email="ap@acme.example", name="Accounts payable")
    return approved_email(agent_actor, manager)


def a_customer_email(agent_actor: Actor, manager: Any) -> Action:
    """The notice of a ``refund_with_notice`` workflow, once its refund succeeded."""
    order = make_order(number="4821", captured="100.00")
    order.customer_email = "carla@example.com"
    order.save(update_fields=["customer_email"])
    make_request(order, 1)
    workflow = workflow_propose(
        template="refund_with_notice",
        parameters={
            "order_number": "4821",
            "request_number": 1,
            "case": "ticket-7",
            "amount": "30.00",
            "currency": "EUR",
            "reason_code": "damaged",
        },
        proposer=agent_actor,
    ).workflow
    if workflow.state == WorkflowState.PROPOSED:
        plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve")
    workflow_advance(workflow_id=workflow.workflow_id)
    refund = Action.objects.get(action_id=f"{workflow.workflow_id}:refund")
    claim = submission_begin(action_pk=refund.pk)
    assert claim.attempt is not None and claim.lease_token is not None
    paid = Effect(
        reference="re_notice",
        status="succeeded",
        outcome=Outcome.SUCCEEDED,
        amount_minor=3000,
        currency="eur",
        action_id=refund.action_id,
    )
    submission_record(
        action_pk=refund.pk, attempt_pk=claim.attempt.pk, lease_token=claim.lease_token, answer=paid.answer()
    )
    workflow_advance(workflow_id=workflow.workflow_id)
    notice = Action.objects.get(action_id=f"{workflow.workflow_id}:notify_customer")
    assert Workflow.objects.get(pk=workflow.pk).state == WorkflowState.RUNNING
    return notice


def a_compensation(agent_actor: Actor, manager: Any) -> Action:
    """The recovery of a refund the provider paid out twice, proposed by an admin."""
    duplicate = duplicate_found(succeeded_refund(agent_actor, manager, amount="40.00"), "re_second")
    admin = make_user("comp.admin", "admin", is_staff=True)
    compensation = discrepancy_compensate(discrepancy_pk=duplicate.pk, user=admin, note="Invoice the customer.")
    return approved(compensation, manager)


KINDS: dict[str, Callable[[Actor, Any], Action]] = {
    "refund": a_refund,
    "invoice-adjustment": an_invoice_adjustment,
    "credit-note-void": a_credit_note_void,
    "supplier_email": a_supplier_email,
    "customer_email": a_customer_email,
    "compensation": a_compensation,
}


def money(action: Action) -> tuple[Decimal, Decimal] | None:
    """What the action draws on: (booked, reserved) on its bill or order; None for none."""
    if action.bill_id is not None:
        bill = Bill.objects.get(pk=action.bill_id)
        return bill.adjusted_amount, bill.reserved_amount
    if action.order_id is not None:
        order = Order.objects.get(pk=action.order_id)
        return order.refunded_amount, order.reserved_amount
    return None


def snapshot(action: Action) -> dict[str, Any]:
    """Everything a refused resolution could have written, read fresh."""
    fresh = Action.objects.get(pk=action.pk)
    return {
        "status": fresh.status,
        "owner": fresh.owner_id,
        "events": ActionEvent.objects.filter(action=action).count(),
        "attempts": Attempt.objects.filter(action=action).count(),
        "remedies": Remedy.objects.filter(action=action).count(),
        "money": money(fresh),
    }


def record_as_failed(client: Client, action: Action) -> Any:
    return client.post(
        reverse("review-action-resolve", args=[action.pk]),
        {"resolution": "failed", "reason": "The receiver holds only a failed record.", "remedy_kind": "store_credit"},
    )


# --- the matrix ------------------------------------------------------------------------------------

MATRIX = [
    # kind, owner group, finance clerk, accounts payable clerk, admin, superuser
    ("refund", "finance", "resolves", 403, 403, 403),
    ("invoice-adjustment", "accounts payable", 403, "resolves", 403, 403),
    ("credit-note-void", "accounts payable", 403, "resolves", 403, 403),
    ("supplier_email", "finance", "resolves", 403, 403, 403),
    ("customer_email", "finance", "resolves", 403, 403, 403),
    ("compensation", "finance", "resolves", 403, 403, 403),
]
CELLS = [
    pytest.param(kind, group, persona, expected, id=f"{kind}-{persona.replace(' ', '_')}")
    for kind, group, *outcomes in MATRIX
    for persona, expected in zip(PERSONAS, outcomes, strict=True)
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "group", "persona", "expected"), CELLS)
def test_only_the_kinds_owner_group_resolves_its_review_items_through_the_page(
    client: Client,
    colleagues: dict[str, Any],
    receivers: dict[str, OnlyAFailedRecord],
    agent_actor: Actor,
    manager: Any,
    kind: str,
    group: str,
    persona: str,
    expected: str | int,
) -> None:
    action = needs_review(KINDS[kind](agent_actor, manager))
    assert action.kind == kind
    assert action.owner == colleagues[group], "a colleague in the owner group owns it, not the persona"
    before = snapshot(action)
    client.force_login(PERSONAS[persona]())

    response = record_as_failed(client, action)

    if expected == "resolves":
        assert response.status_code == 302, response.content.decode()[:2000]
        after = snapshot(action)
        assert after["status"] == S.FAILED_FINAL
        if before["money"] is not None:
            # A compensation reserves nothing on its order (its recovery is a person's work).
            held = Decimal(0) if kind == "compensation" else action.amount
            booked, reserved = before["money"]
            assert after["money"] == (booked, reserved - held), "the reservation is released"
        return
    assert response.status_code == expected
    page = response.content.decode()
    assert "Nothing was changed." in page
    if persona == "superuser":
        assert "Admins do not resolve review items" in page and "(separation of duties)" in page
    elif persona == "admin":
        # The admin role does not even hold the permission to resolve.
        assert "Only finance may resolve an action that needs review." in page
    else:
        assert f"Only {group} may resolve {kind_for(kind).label.lower()}s" in page
    assert snapshot(action) == before
    assert not any(receiver.asked for receiver in receivers.values()), "a refused person never asks the receiver"


def test_the_refusal_is_the_same_with_htmx_and_names_the_owner_group(
    client: Client, colleagues: dict[str, Any], receivers: dict[str, OnlyAFailedRecord], agent_actor: Actor
) -> None:
    """The reproduction: alex (accounts payable) records finance's 150.00 EUR refund as failed."""
    action = needs_review(authorized_refund(agent_actor, captured="150.00"))
    before = snapshot(action)
    client.force_login(make_user("alex.payable", "accounts payable"))

    response = client.post(
        reverse("review-action-resolve", args=[action.pk]),
        {"origin": "detail", "resolution": "failed", "reason": "r", "remedy_kind": "store_credit"},
        headers=HTMX,
    )

    assert response.status_code == 403
    assert (
        "Only finance may resolve refunds (the owner group on the five-checks page), or the person an item was "
        "given to; you are neither." in response.content.decode()
    )
    assert snapshot(action) == before
    assert not receivers, "no receiver was even made"


# --- follow-ups ------------------------------------------------------------------------------------


def a_refunds_discrepancy(agent_actor: Actor, manager: Any) -> Discrepancy:
    return duplicate_found(succeeded_refund(agent_actor, manager), "re_second")


def an_adjustments_discrepancy(agent_actor: Actor, manager: Any) -> Discrepancy:
    return adjustments_duplicate_found(succeeded_adjustment(agent_actor, manager))


def a_discrepancy_with_no_action(agent_actor: Actor, manager: Any) -> Discrepancy:
    return Discrepancy.objects.create(kind=DiscrepancyKind.EFFECT_WITHOUT_ACTION, provider_reference="re_stray")


FOLLOW_UPS: dict[str, Callable[[Actor, Any], Discrepancy]] = {
    "refund": a_refunds_discrepancy,
    "invoice-adjustment": an_adjustments_discrepancy,
    "none": a_discrepancy_with_no_action,
}
FOLLOW_UP_MATRIX = [
    # the action's kind, finance clerk, accounts payable clerk, admin, superuser
    ("refund", "works it", 403, 403, 403),
    ("invoice-adjustment", 403, "works it", 403, 403),
    ("none", "works it", "works it", 403, 403),
]


@pytest.mark.parametrize(
    ("kind", "persona", "expected"),
    [
        pytest.param(kind, persona, expected, id=f"{kind}-{persona.replace(' ', '_')}")
        for kind, *outcomes in FOLLOW_UP_MATRIX
        for persona, expected in zip(PERSONAS, outcomes, strict=True)
    ],
)
def test_a_discrepancy_is_worked_by_its_actions_owner_group(
    client: Client, agent_actor: Actor, manager: Any, kind: str, persona: str, expected: str | int
) -> None:
    discrepancy = FOLLOW_UPS[kind](agent_actor, manager)
    client.force_login(PERSONAS[persona]())

    response = client.post(
        reverse("review-discrepancy-advance", args=[discrepancy.pk]), {"status": "in_progress", "note": "Looking."}
    )

    discrepancy.refresh_from_db()
    if expected == "works it":
        assert response.status_code == 302
        assert discrepancy.status == DiscrepancyStatus.IN_PROGRESS
        return
    assert response.status_code == expected
    assert (discrepancy.status, discrepancy.owner_id, discrepancy.note) == (DiscrepancyStatus.OPEN, None, "")


@pytest.mark.parametrize(
    ("persona", "expected"),
    [("finance clerk", 302), ("accounts payable clerk", 403), ("admin", 403), ("superuser", 403)],
)
def test_a_remedy_of_a_refund_is_worked_by_finance(
    client: Client, receivers: dict[str, OnlyAFailedRecord], agent_actor: Actor, persona: str, expected: int
) -> None:
    action = needs_review(authorized_refund(agent_actor))
    remedy = Remedy.objects.create(action=action, amount=action.amount, currency=action.currency)
    client.force_login(PERSONAS[persona]())

    response = client.post(reverse("review-remedy-advance", args=[remedy.pk]), {"status": "in_progress"})

    assert response.status_code == expected
    remedy.refresh_from_db()
    assert remedy.status == ("in_progress" if expected == 302 else "open")


# --- given explicitly, and the one definition of the owner group -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_someone_an_admin_gave_the_item_to_resolves_it_outside_the_owner_group(
    client: Client,
    colleagues: dict[str, Any],
    receivers: dict[str, OnlyAFailedRecord],
    agent_actor: Actor,
    manager: Any,
) -> None:
    """An admin hands an invoice adjustment to a member of finance (accounts payable is away):
    she resolves that one, and still no other adjustment."""
    given = needs_review(an_invoice_adjustment(agent_actor, manager))
    other = needs_review(an_invoice_adjustment(agent_actor, manager))
    fiona = make_user("fiona.finance", "finance")
    action_owner_assign(
        action_pk=given.pk, owner=fiona, user=make_user("ada.admin", "admin", is_staff=True), reason="Pat is away."
    )
    client.force_login(fiona)

    assert record_as_failed(client, other).status_code == 403
    assert record_as_failed(client, given).status_code == 302

    assert Action.objects.get(pk=given.pk).status == S.FAILED_FINAL
    assert Action.objects.get(pk=other.pk).status == S.NEEDS_REVIEW


@pytest.mark.django_db(transaction=True)
def test_the_owner_group_an_admin_maps_a_kind_to_is_the_one_that_resolves_it(
    client: Client, colleagues: dict[str, Any], receivers: dict[str, OnlyAFailedRecord], agent_actor: Actor
) -> None:
    """The same definition as the five-checks page: an OwnerGroup row moves refunds to accounts
    payable, and the page, the buttons and the refusal all follow it."""
    action = needs_review(authorized_refund(agent_actor))
    OwnerGroup.objects.create(kind="refund", group=Group.objects.get(name="accounts payable"))
    finance_clerk = make_user("fiona.finance", "finance")
    payable_clerk = make_user("alex.payable", "accounts payable")

    client.force_login(finance_clerk)
    assert "Owner group: accounts payable." in client.get(reverse("kinds")).content.decode()
    response = record_as_failed(client, action)
    assert response.status_code == 403
    assert "Only accounts payable may resolve refunds" in response.content.decode()

    client.force_login(payable_clerk)
    assert record_as_failed(client, action).status_code == 302
    assert Action.objects.get(pk=action.pk).status == S.FAILED_FINAL


# --- what the pages offer ----------------------------------------------------------------------------


def resolve_forms(page: str) -> list[str]:
    return [form for form in ("resolve-succeeded", "resolve-failed") if f'id="{form}"' in page]


def test_the_detail_page_shows_the_resolutions_only_to_the_owner_group_and_says_why_to_others(
    client: Client, colleagues: dict[str, Any], agent_actor: Actor, manager: Any
) -> None:
    refund = needs_review(authorized_refund(agent_actor))
    adjustment = needs_review(an_invoice_adjustment(agent_actor, manager))
    finance_clerk = make_user("fiona.finance", "finance")
    payable_clerk = make_user("alex.payable", "accounts payable")

    for clerk, theirs, not_theirs, group in (
        (finance_clerk, refund, adjustment, "accounts payable"),
        (payable_clerk, adjustment, refund, "finance"),
    ):
        client.force_login(clerk)
        page = client.get(reverse("review-action", args=[theirs.pk])).content.decode()
        assert resolve_forms(page) == ["resolve-succeeded", "resolve-failed"]
        assert 'data-testid="work-refusal"' not in page
        page = client.get(reverse("review-action", args=[not_theirs.pk])).content.decode()
        assert resolve_forms(page) == []
        assert "Look up at the provider now" not in page
        assert "Read only" in page
        assert f"Only {group} may resolve" in page


def test_the_reassign_list_offers_the_kinds_owner_group_and_the_service_accepts_only_them(
    client: Client, colleagues: dict[str, Any], agent_actor: Actor, manager: Any
) -> None:
    """An invoice adjustment is passed on within accounts payable, a refund within finance; a
    forged form naming someone from the other group is refused and changes nothing."""
    refund = needs_review(authorized_refund(agent_actor))
    adjustment = needs_review(an_invoice_adjustment(agent_actor, manager))
    fiona = make_user("fiona.finance", "finance")
    alex = make_user("alex.payable", "accounts payable")
    make_user("root", is_staff=True, is_superuser=True)

    client.force_login(alex)
    assert reassign_options(client.get(reverse("review-action", args=[adjustment.pk])).content.decode()) == {
        "alex.payable"
    }, "pat owns it; the only other member of accounts payable is alex"
    client.force_login(fiona)
    assert reassign_options(client.get(reverse("review-action", args=[refund.pk])).content.decode()) == {
        "fiona.finance"
    }

    client.force_login(make_user("pia.payable", "accounts payable"))
    forged = client.post(
        reverse("review-action-assign", args=[adjustment.pk]), {"origin": "detail", "owner": str(fiona.pk)}
    )
    assert forged.status_code == 400
    assert "owner: that person is not an active member of accounts payable." in forged.content.decode()
    assert Action.objects.get(pk=adjustment.pk).owner == colleagues["accounts payable"]

    passed_on = client.post(
        reverse("review-action-assign", args=[adjustment.pk]), {"origin": "detail", "owner": str(alex.pk)}
    )
    assert passed_on.status_code == 302
    assert Action.objects.get(pk=adjustment.pk).owner == alex


def test_someone_outside_the_owner_group_cannot_take_the_item_and_then_resolve_it_as_its_owner(
    client: Client, colleagues: dict[str, Any], agent_actor: Actor
) -> None:
    """ "Assign to me" is working on the item too: otherwise accounts payable could take a refund
    and then resolve it as its owner."""
    refund = needs_review(authorized_refund(agent_actor))
    client.force_login(make_user("alex.payable", "accounts payable"))

    response = client.post(reverse("review-action-assign", args=[refund.pk]), {"origin": "detail"})

    assert response.status_code == 403
    assert Action.objects.get(pk=refund.pk).owner == colleagues["finance"]
