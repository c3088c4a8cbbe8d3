"""The manager sees the message exactly as it will be sent, escaped."""

from __future__ import annotations

from typing import Any

import pytest

from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import ActionStatus
from approvals.models import Decision
from approvals.services import approval_decide
from tests.mail import BILL_PARAMETERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def test_the_inbox_and_the_detail_page_show_the_rendered_message_escaped(
    client: Any, manager: Any, supplier: Any, agent_actor: Any
) -> None:
    parameters = {**BILL_PARAMETERS, "reason": "<script>alert('x')</script> & more"}
    action = supplier_email_propose(
        supplier="ACME",
        reference="bill-1",
        template="bill_adjusted",
        parameters=parameters,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    client.force_login(manager)

    for url in ("/approvals/", f"/approvals/{action.pk}/"):
        page = client.get(url).content.decode()
        assert 'data-testid="message-preview"' in page, url
        assert "Bill BL-1042: adjusted by 120.00 EUR" in page
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
        assert "<script>alert" not in page
        assert action.payload["message_id"].strip("<>") in page


def test_a_manager_without_a_money_limit_may_approve_an_email_but_never_the_proposer(
    manager: Any, supplier: Any, agent_actor: Any, agent_owner: Any
) -> None:
    """Invariant 10: four eyes still hold; no approval limit applies to a message."""
    from approvals.services import DecisionRefused

    action = supplier_email_propose(
        supplier="ACME",
        reference="bill-2",
        template="bill_adjusted",
        parameters=BILL_PARAMETERS,
        to="ap@acme.example",
        proposer=agent_actor,
    ).action
    with pytest.raises(DecisionRefused):
        approval_decide(action_pk=action.pk, user=agent_owner, decision=Decision.APPROVE)
    approval_decide(action_pk=action.pk, user=manager, decision=Decision.APPROVE)
    action.refresh_from_db()
    assert action.status == ActionStatus.AUTHORIZED
