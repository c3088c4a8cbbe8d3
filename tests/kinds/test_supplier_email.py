"""The supplier-email kind against the mail sandbox: its answer table, proved by what the
sandbox kept.

| relay                                   | action                               |
|-----------------------------------------|--------------------------------------|
| 250                                     | SUCCEEDED, one message               |
| 4xx before DATA                         | back to AUTHORIZED, nothing kept     |
| 5xx                                     | FAILED_FINAL                         |
| stored, then the connection dropped     | NEEDS_REVIEW at once, owner and due  |
| stored, then too slow (timeout)         | NEEDS_REVIEW at once, owner and due  |
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import check_effects
from actions.engine.sweeps import sweep_authorized
from actions.kinds import kind_for
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import Action, ActionEvent, ActionStatus, Attempt
from approvals.models import Decision
from approvals.services import approval_decide
from tests.mail import BILL_PARAMETERS, MailSandboxClient

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests dispatch by hand, so that each step is visible.
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def approved_email(agent_actor: Any, manager: Any, *, reference: str = "bill-1042") -> Action:
    action = supplier_email_propose(
        supplier="ACME",
        reference=reference,
        template="bill_adjusted",
        parameters=BILL_PARAMETERS,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    assert action.status == S.PROPOSED, "a person reads every message to a supplier"
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    return Action.objects.get(pk=action.pk)


def test_a_250_records_the_message_as_sent_once_with_its_stable_message_id(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any
) -> None:
    """Invariants 1 and 2: one message, recorded under the reference derived from the action id,
    carrying the Message-ID and the action id header; the text is the payload's, byte for byte."""
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.SUCCEEDED

    done = Action.objects.get(pk=action.pk)
    messages = mail_sandbox.messages(action.action_id)
    assert len(messages) == 1
    assert messages[0]["message_id"] == done.payload["message_id"]
    assert messages[0]["subject"] == done.payload["subject"] == "Bill BL-1042: adjusted by 120.00 EUR"
    assert messages[0]["body"] == done.payload["body"]
    assert messages[0]["rcpt_to"] == "ap@acme.example"
    assert done.provider_reference == kind_for(done.kind).default_reference(done)
    assert check_effects(ledger=list(kind_for(done.kind).receiver().ledger())).ok


def test_a_4xx_before_data_sends_nothing_and_the_action_goes_back_for_another_send(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any
) -> None:
    """Invariants 7 and 16: the relay's 451 to RCPT TO proves it never had the message (the
    sandbox kept nothing), so the action returns to AUTHORIZED under the same approval; the next
    claim sends it, and exactly one message exists in the end."""
    mail_sandbox.fault(mode="defer", count=1)
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.AUTHORIZED
    assert mail_sandbox.messages() == [], "a 4xx before DATA: the relay has nothing"
    attempt = Attempt.objects.get(action=action)
    assert attempt.outcome == "not_sent" and attempt.error is not None
    assert attempt.error["raw"]["smtp_code"] == 451 and attempt.error["raw"]["content_sent"] is False

    # The sweep's grace period spaces the sends out; then it claims it again.
    later = timezone.now() + timedelta(minutes=1)
    assert sweep_authorized(now=later) == 1
    done = Action.objects.get(pk=action.pk)
    assert done.status == S.SUCCEEDED and done.attempt_count == 2
    assert len(mail_sandbox.messages(action.action_id)) == 1
    assert list(ActionEvent.objects.filter(action=done).values_list("transition", flat=True)) == [
        "propose",
        "approve",
        "begin_submission",
        "record_not_sent",
        "begin_submission",
        "record_success",
    ]


def test_a_relay_that_keeps_deferring_goes_to_a_person_instead_of_being_asked_for_ever(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any, finance: Any, settings: Any
) -> None:
    """Invariant 8: NOT_SENT_MAX_ATTEMPTS refusals, and it is a named person's."""
    settings.NOT_SENT_MAX_ATTEMPTS = 2
    mail_sandbox.fault(mode="defer")
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.AUTHORIZED
    assert sweep_authorized(now=timezone.now() + timedelta(minutes=1)) == 1

    done = Action.objects.get(pk=action.pk)
    assert done.status == S.NEEDS_REVIEW and done.owner == finance and done.due_at is not None
    assert mail_sandbox.messages() == []


def test_a_5xx_is_a_final_failure(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any
) -> None:
    mail_sandbox.fault(mode="reject", count=1)
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL
    assert mail_sandbox.messages() == []


def test_a_5xx_after_the_content_is_a_final_failure_too(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any
) -> None:
    mail_sandbox.fault(mode="reject_data", count=1)
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL
    assert mail_sandbox.messages() == []


@pytest.mark.parametrize("fault", [{"mode": "drop_after_data"}, {"mode": "slow", "sleep_seconds": 2}])
def test_a_send_that_may_have_arrived_goes_to_a_named_person_at_once_and_is_never_resent(
    fault: dict[str, Any], mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any, finance: Any
) -> None:
    """Invariant 16: the sandbox kept the message but the reply never came; the action needs
    review with an owner and a due time, and no sweep or reconciliation sends it again."""
    mail_sandbox.fault(count=1, **fault)
    action = approved_email(agent_actor, manager)

    assert execution_dispatch(action_pk=action.pk) == S.NEEDS_REVIEW

    held = Action.objects.get(pk=action.pk)
    assert held.owner == finance and held.due_at is not None and held.due_at > timezone.now()
    assert len(mail_sandbox.messages(action.action_id)) == 1
    later = timezone.now() + timedelta(hours=1)
    assert sweep_authorized(now=later) == 0
    assert execution_dispatch(action_pk=action.pk) == "taken"
    assert len(mail_sandbox.messages(action.action_id)) == 1


def test_the_kinds_page_shows_the_email_card_red_where_it_is_red(client: Any, finance: Any) -> None:
    """Safe to repeat? and Outcome unknown? are red for a relay with no keys and no lookup, and
    so is the ambiguous row of its answer table."""
    client.force_login(finance)
    page = client.get("/kinds/").content.decode()
    card = page[page.index('id="kind-supplier_email"') :]
    card = card[: card.index("</section>")]
    assert 'data-check="2" data-ok="no"' in card
    assert 'data-check="3" data-ok="no"' in card
    assert "mail relay" in card
    table = card[card.index("answer-table") :]
    assert table.count('data-ok="no"') == 1 and table.count('data-ok="yes"') == 3  # only the ambiguous row
    assert "never resent automatically" in card


def test_a_change_to_the_suppliers_contacts_after_the_approval_makes_the_email_stale_and_sends_nothing(
    mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any
) -> None:
    """Invariant 6: the approval bound the supplier's version; the address was removed since."""
    action = approved_email(agent_actor, manager)
    supplier.contacts.update(active=False)
    type(supplier).objects.filter(pk=supplier.pk).update(version=supplier.version + 1)

    assert execution_dispatch(action_pk=action.pk) == "stale"

    assert Action.objects.get(pk=action.pk).status == S.STALE
    assert mail_sandbox.messages() == []
