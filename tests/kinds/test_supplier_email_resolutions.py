"""Finance's resolutions for an ambiguous email, and the audit against the mail sandbox:
"confirm delivered" with evidence, "send again" as a recorded decision that marks
the repeat, "abandon"; two messages for one action are a discrepancy unless a person chose to
send again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from actions.engine.dispatch import execution_dispatch
from actions.engine.invariants import check_effects
from actions.engine.ledger import ledger_audit_run
from actions.engine.resolution_checks import ReviewRefused
from actions.engine.resolutions import (
    action_resolve_failed,
    action_resolve_resend,
    action_resolve_retry,
    action_resolve_succeeded,
)
from actions.kinds import kind_for
from actions.kinds.supplier_email.contract import outgoing_email
from actions.models import Action, ActionEvent, ActionStatus, Discrepancy, DiscrepancyKind
from actions.providers.mail.smtp import SmtpMailer
from tests.kinds.test_supplier_email import approved_email
from tests.mail import MailSandboxClient

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus


class NoRefunds:
    """The payment provider is not part of these tests: its ledger is empty."""

    contract = kind_for("refund").contract()

    def ledger(self, window: Any = None) -> Iterator[Any]:
        return iter(())


ONLY_EMAIL: dict[str, Any] = {"refund": NoRefunds()}


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


@pytest.fixture
def ambiguous(mail_sandbox: MailSandboxClient, supplier: Any, agent_actor: Any, manager: Any, finance: Any) -> Action:
    """An email the relay stored and then dropped the connection on: NEEDS_REVIEW, owned by finance."""
    mail_sandbox.fault(mode="drop_after_data", count=1)
    action = approved_email(agent_actor, manager)
    assert execution_dispatch(action_pk=action.pk) == S.NEEDS_REVIEW
    return Action.objects.get(pk=action.pk)


def test_confirm_delivered_needs_the_evidence_and_records_the_message_id(
    ambiguous: Action, finance: Any, mail_sandbox: MailSandboxClient
) -> None:
    """Invariant 2: the action SUCCEEDED under the message's reference, with the person's
    evidence on the audit event, and the sandbox still holds exactly one message."""
    with pytest.raises(ReviewRefused) as refused:
        action_resolve_succeeded(action_pk=ambiguous.pk, user=finance, provider_reference="", reason="Supplier replied")
    assert refused.value.field == "evidence"

    result = action_resolve_succeeded(
        action_pk=ambiguous.pk,
        user=finance,
        provider_reference="",
        reason="The supplier answered the message.",
        evidence="Reply from ap@acme.example at 10:42: 'Thanks, noted the adjustment.'",
    )

    done = result.action
    assert done.status == S.SUCCEEDED
    assert done.provider_reference == kind_for(done.kind).default_reference(done)
    event = ActionEvent.objects.get(action=done, transition="resolve_succeeded")
    assert "Thanks, noted" in event.evidence["evidence"]
    assert len(mail_sandbox.messages(done.action_id)) == 1
    assert check_effects(ledger=list(kind_for(done.kind).receiver().ledger())).ok


def test_the_same_key_retry_is_refused_for_a_receiver_that_cannot_be_asked(ambiguous: Action, finance: Any) -> None:
    with pytest.raises(ReviewRefused):
        action_resolve_retry(action_pk=ambiguous.pk, user=finance, reason="try again")
    assert Action.objects.get(pk=ambiguous.pk).status == S.NEEDS_REVIEW


def test_send_again_is_a_recorded_decision_and_marks_the_repeat_in_a_header_and_the_first_line(
    ambiguous: Action, finance: Any, mail_sandbox: MailSandboxClient
) -> None:
    """Invariant 16: the second message exists only after the person's decision, which the
    trail records as accepting a possible duplicate; the audits show it as a chosen repeat."""
    with pytest.raises(ReviewRefused) as refused:
        action_resolve_resend(action_pk=ambiguous.pk, user=finance, reason="")
    assert refused.value.field == "reason"
    assert len(mail_sandbox.messages(ambiguous.action_id)) == 1

    result = action_resolve_resend(
        action_pk=ambiguous.pk, user=finance, reason="Supplier says nothing arrived; phone call with Ann at 11:05."
    )

    assert result.action.status == S.SUCCEEDED
    first, second = mail_sandbox.messages(ambiguous.action_id)
    assert first["message_id"] == second["message_id"] == ambiguous.payload["message_id"]
    assert first["possible_repeat"] == "" and second["possible_repeat"].startswith("yes")
    assert second["body"].startswith("[Possible repeat: this message may already have reached you")
    assert second["body"].endswith(ambiguous.payload["body"])
    decision = ActionEvent.objects.get(action=ambiguous, transition="resolve_resend")
    assert decision.evidence["possible_duplicate"] is True and decision.actor_user == finance

    report = check_effects(ledger=list(kind_for(ambiguous.kind).receiver().ledger()))
    assert report.ok and report.repeats_by_decision == 1 and report.duplicates == 0
    run = ledger_audit_run(receivers=ONLY_EMAIL)
    assert run.error == ""
    assert list(Discrepancy.objects.values_list("kind", flat=True)) == [DiscrepancyKind.REPEAT_BY_DECISION]
    assert run.discrepancies_found == 1


def test_two_messages_without_a_decision_are_a_duplicate_in_both_audits(
    ambiguous: Action, mail_sandbox: MailSandboxClient
) -> None:
    """The audit answers "has it already happened twice?": a second copy nobody chose is a
    violation of invariant 1 and a discrepancy for finance."""
    SmtpMailer(timeout_seconds=2).send(outgoing_email(ambiguous))  # as if someone sent it by hand

    report = check_effects(ledger=list(kind_for(ambiguous.kind).receiver().ledger()))
    assert [v.invariant for v in report.violations] == [1] and report.duplicates == 1
    ledger_audit_run(receivers=ONLY_EMAIL)
    assert list(Discrepancy.objects.values_list("kind", flat=True)) == [DiscrepancyKind.DUPLICATE_EFFECT]


def test_abandon_records_a_final_failure_with_the_reason(ambiguous: Action, finance: Any) -> None:
    result = action_resolve_failed(action_pk=ambiguous.pk, user=finance, reason="Supplier closed; we phoned instead.")

    assert result.action.status == S.FAILED_FINAL
    assert result.remedy is None
    event = ActionEvent.objects.get(action=ambiguous, transition="resolve_failed")
    assert event.reason == "Supplier closed; we phoned instead."


def test_the_review_page_offers_confirm_send_again_and_abandon_and_no_same_key_retry(
    ambiguous: Action, finance: Any, client: Any
) -> None:
    client.force_login(finance)
    page = client.get(reverse("review-action", args=[ambiguous.pk])).content.decode()

    assert 'data-testid="cannot-be-asked"' in page
    assert 'id="resolve-resend"' in page and 'id="resolve-retry"' not in page
    assert "Confirm delivered" in page and "Send again" in page and "Abandon" in page
    assert kind_for(ambiguous.kind).default_reference(ambiguous) in page


def test_finance_sends_again_from_the_review_page(
    ambiguous: Action, finance: Any, client: Any, mail_sandbox: MailSandboxClient
) -> None:
    client.force_login(finance)
    response = client.post(
        reverse("review-action-resolve", args=[ambiguous.pk]),
        {"resolution": "resend", "reason": "Supplier asked for it again by phone."},
    )

    assert response.status_code in (200, 302)
    assert Action.objects.get(pk=ambiguous.pk).status == S.SUCCEEDED
    assert len(mail_sandbox.messages(ambiguous.action_id)) == 2
