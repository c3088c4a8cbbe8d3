"""Workflows end to end in one process: identity, the plan's approval, running in order, pausing
on an unknown outcome, and compensating in reverse (invariants 12 to 15)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine import send
from actions.engine.invariants import check_effects
from actions.engine.reconcile import reconcile_action
from actions.engine.resolutions import action_resolve_failed, action_resolve_succeeded
from actions.foundation.trail import Actor
from actions.kinds.base import Effect, Outcome
from actions.kinds.fields import ProposalInvalid
from actions.models import Action, ActionStatus, Bill, Remedy, Workflow, WorkflowEvent, WorkflowState
from actions.notifications import waiting_count_for
from actions.workflows.services import (
    PlanDecisionRefused,
    WorkflowConflict,
    plan_decide,
    workflow_propose,
    workflow_summary,
)
from approvals.models import Approval, WorkflowApproval
from approvals.selectors.inbox import proposal_inbox_get
from approvals.services import approval_decide
from tests.workflows.conftest import World, po_parameters, refund_parameters

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
W = WorkflowState
PO = "po-mismatch:bill-INV-42:case-1"


def approved_po(world: World, agent_actor: Actor, manager: Any, **overrides: Any) -> Workflow:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(**overrides), proposer=agent_actor
    ).workflow
    assert workflow.state == W.PROPOSED  # an email to a supplier is always a person's call
    return plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve", note="ok")


def test_the_workflow_id_and_child_keys_come_from_business_references(
    world: World, agent_actor: Actor, manager: Any
) -> None:
    """Invariant 12: each step runs once, in order, under its own key."""
    workflow = approved_po(world, agent_actor, manager)
    assert workflow.workflow_id == PO
    assert world.run(PO) == W.COMPLETED
    keys = [key for key, _ in world.effects]
    assert keys == [f"{PO}:post_credit_note", f"{PO}:email_supplier"]
    read = workflow.steps.get(name="read_documents")
    assert read.result is not None and read.result["purchase_order"]["number"] == "PO-INV-42"
    bill = Bill.objects.get(number="INV-42")
    assert bill.adjusted_amount == Decimal("20.00") and bill.reserved_amount == 0
    # Each child was claimed only after the step before it was recorded SUCCEEDED.
    steps = list(workflow.steps.order_by("position"))
    post, email = steps[1].action, steps[2].action
    assert post is not None and email is not None
    assert post.events.get(transition="record_success").created_at <= email.events.get(transition="propose").created_at
    assert [s.completion_order for s in steps] == [1, 2, 3]
    summary = workflow_summary(Workflow.objects.get(pk=workflow.pk))
    assert summary["final"] is True and [s["state"] for s in summary["steps"]] == ["SUCCEEDED"] * 3


def test_one_live_workflow_per_case(world: World, agent_actor: Actor, manager: Any) -> None:
    """Invariant 15: the same plan returns the live workflow; another plan is refused naming it."""
    first = workflow_propose(template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor)
    again = workflow_propose(template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor)
    assert first.created and not again.created and again.workflow.pk == first.workflow.pk
    # The same plan under another case reference (a late sub-agent) is the same decision.
    late = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(case="case-9"), proposer=agent_actor
    )
    assert late.workflow.pk == first.workflow.pk
    with pytest.raises(WorkflowConflict) as conflict:
        workflow_propose(
            template="po_mismatch_resolution", parameters=po_parameters(amount="25.00"), proposer=agent_actor
        )
    assert PO in str(conflict.value) and conflict.value.live.pk == first.workflow.pk
    assert Workflow.objects.count() == 1


def test_bad_input_names_the_field_and_writes_nothing(world: World, agent_actor: Actor) -> None:
    with pytest.raises(ProposalInvalid) as invalid:
        workflow_propose(
            template="po_mismatch_resolution",
            parameters=po_parameters(to="stranger@example.com", amount="-1"),
            proposer=agent_actor,
        )
    assert "parameters.amount" in {p.field for p in invalid.value.problems}
    with pytest.raises(ProposalInvalid) as unknown:
        workflow_propose(template="nope", parameters={}, proposer=agent_actor)
    assert unknown.value.problems[0].field == "template"
    with pytest.raises(ProposalInvalid) as contact:
        workflow_propose(
            template="po_mismatch_resolution", parameters=po_parameters(to="x@else.example"), proposer=agent_actor
        )
    assert contact.value.problems[0].field == "parameters.to"
    assert Workflow.objects.count() == 0 and WorkflowEvent.objects.count() == 0


def test_the_approval_binds_the_plan(world: World, agent_actor: Actor, manager: Any, agent_owner: Any) -> None:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(), proposer=agent_actor
    ).workflow
    with pytest.raises(PlanDecisionRefused) as four_eyes:
        plan_decide(workflow_pk=workflow.pk, user=agent_owner, decision="approve")
    assert four_eyes.value.code in ("four_eyes", "not_a_manager")
    plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve")
    approval = WorkflowApproval.objects.get(workflow=workflow)
    assert approval.plan_hash == workflow.plan_hash and approval.expires_at is not None
    assert approval.totals == {"EUR": "20.00"}
    by_step = {b["step"]: b for b in approval.bindings}
    assert by_step["post_credit_note"]["version"] == world.bill.version
    assert by_step["email_supplier"]["version"] == world.supplier.version
    assert by_step["post_credit_note"]["amount"] == "20.00" and by_step["post_credit_note"]["currency"] == "EUR"
    world.run(PO)
    child = Action.objects.get(action_id=f"{PO}:post_credit_note")
    assert Approval.objects.get(action=child).order_version == by_step["post_credit_note"]["version"]


def test_over_the_managers_plan_total_limit_is_refused(world: World, agent_actor: Actor, second_manager: Any) -> None:
    workflow = workflow_propose(
        template="po_mismatch_resolution", parameters=po_parameters(amount="150.00"), proposer=agent_actor
    ).workflow
    with pytest.raises(PlanDecisionRefused) as refused:
        plan_decide(workflow_pk=workflow.pk, user=second_manager, decision="approve")
    assert refused.value.code == "over_limit"
    assert Workflow.objects.get(pk=workflow.pk).state == W.PROPOSED


def test_a_final_failure_compensates_completed_steps_in_reverse_once_each(
    world: World, agent_actor: Actor, manager: Any
) -> None:
    """Invariants 13 and 14: the correction email, then the void; each once, its own key."""
    # The supplier email is refused for good; the credit note before it is voided.
    world.script[f"{PO}:email_supplier"] = Outcome.FAILED_FINAL
    approved_po(world, agent_actor, manager)
    assert world.run(PO) == W.COMPENSATED
    compensations = [key for key, _ in world.effects if key.endswith(":compensate")]
    # The email failed: only the credit note had an effect to walk back.
    assert compensations == [f"{PO}:post_credit_note:compensate"]
    void = Action.objects.get(action_id=f"{PO}:post_credit_note:compensate")
    assert void.payload["credit_note"] == Action.objects.get(action_id=f"{PO}:post_credit_note").provider_reference
    assert world.run(PO) == W.COMPENSATED
    assert world.effects_for(f"{PO}:post_credit_note:compensate") == 1


def test_compensation_runs_in_reverse_completion_order(world: World, agent_actor: Actor, manager: Any) -> None:
    """A template whose third step fails after two compensable ones: reverse order, once each."""
    from actions.workflows import templates
    from actions.workflows.templates import building, po_mismatch

    spec = po_mismatch.PO_STEPS
    extra = templates.StepSpec("final_check", "supplier_email", templates.StepClass.IRREVERSIBLE, None, "last")
    original = templates._TEMPLATES["po_mismatch_resolution"]
    base_validate = original.validate

    def validate(raw: dict[str, Any]) -> templates.Proposal:
        proposal = base_validate(raw)
        email = dict(proposal.plan["steps"][2])
        check = {**email, "position": 4, "name": "final_check", "compensation": {"kind": None, "note": "last"}}
        check["payload"] = {**email["payload"], "reference": "check-1"}
        steps = [*proposal.plan["steps"], check]
        return templates.Proposal(
            proposal.workflow_id,
            proposal.case,
            proposal.parameters,
            {**proposal.plan, "steps": steps},
            templates.plan_hash_of("po_mismatch_resolution", building.without_message_ids(steps)),
        )

    templates._TEMPLATES["po_mismatch_resolution"] = templates.Template(
        name=original.name,
        label=original.label,
        parameters=original.parameters,
        steps=(*spec, extra),
        validate=validate,
    )
    try:
        world.script[f"{PO}:final_check"] = Outcome.FAILED_FINAL
        approved_po(world, agent_actor, manager)
        assert world.run(PO) == W.COMPENSATED
    finally:
        templates._TEMPLATES["po_mismatch_resolution"] = original
    compensations = [key for key, _ in world.effects if key.endswith(":compensate")]
    assert compensations == [f"{PO}:email_supplier:compensate", f"{PO}:post_credit_note:compensate"]
    events = WorkflowEvent.objects.filter(workflow__workflow_id=PO, transition="compensation_started")
    assert [e.evidence["step"] for e in events.order_by("pk")] == ["email_supplier", "post_credit_note"]


def test_an_unknown_outcome_pauses_and_compensates_nothing(
    world: World, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """Invariant 14 and 16: the supplier email's outcome is unknown (no keys, no lookup): it goes
    to a named person, the workflow pauses, and nothing is walked back until it is known."""
    world.script[f"{PO}:email_supplier"] = Outcome.UNKNOWN
    approved_po(world, agent_actor, manager)
    assert world.run(PO) == W.PAUSED
    workflow = Workflow.objects.get(workflow_id=PO)
    email = Action.objects.get(action_id=f"{PO}:email_supplier")
    assert email.status == S.NEEDS_REVIEW and workflow.owner_id == email.owner_id is not None
    assert not [key for key, _ in world.effects if key.endswith(":compensate")]
    # Finance records that it failed for good: now, and only now, the credit note is voided.
    owner = email.owner
    action_resolve_failed(action_pk=email.pk, user=owner, reason="The relay log shows it bounced.")
    assert world.run(PO) == W.COMPENSATED
    assert [key for key, _ in world.effects if key.endswith(":compensate")] == [f"{PO}:post_credit_note:compensate"]


def test_a_last_step_paused_on_an_unknown_outcome_then_found_delivered_completes_the_workflow(
    world: World, agent_actor: Actor, manager: Any, finance: Any
) -> None:
    """The supplier email (the last step) is held for a person; she finds it was delivered. The
    workflow was PAUSED on that step and now has nothing left to run: it resumes and completes,
    and nothing is compensated. (Found by the CI chaos run: the coordinator tried PAUSED ->
    COMPLETED, which the state machine rightly refuses, and the workflow stayed paused.)"""
    world.script[f"{PO}:email_supplier"] = Outcome.UNKNOWN
    approved_po(world, agent_actor, manager)
    assert world.run(PO) == W.PAUSED
    email = Action.objects.get(action_id=f"{PO}:email_supplier")
    action_resolve_succeeded(
        action_pk=email.pk,
        user=finance,
        provider_reference="relay-log-1",
        reason="The supplier answered the message.",
        evidence="Reply from the supplier quoting the message.",
    )

    assert world.run(PO) == W.COMPLETED
    assert not [key for key, _ in world.effects if key.endswith(":compensate")]
    transitions = list(WorkflowEvent.objects.filter(workflow__workflow_id=PO).values_list("transition", flat=True))
    assert transitions[-2:] == ["resume", "complete"]


def test_refund_with_notice_has_no_compensation_and_opens_a_remedy(
    world: World, agent_actor: Actor, manager: Any
) -> None:
    refund_key = "refund-notice:order-4821:request-1:ticket-7:refund"
    world.script[refund_key] = Outcome.FAILED_FINAL
    result = workflow_propose(template="refund_with_notice", parameters=refund_parameters(), proposer=agent_actor)
    workflow = result.workflow
    if workflow.state == W.PROPOSED:
        plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve")
    assert world.run(workflow.workflow_id) == W.COMPENSATED
    assert world.effects == []  # the refund failed; no notice went out; nothing to walk back
    assert Remedy.objects.filter(action__action_id=refund_key).exists()
    steps = workflow_summary(Workflow.objects.get(pk=workflow.pk))["steps"]
    assert all(step["compensation"]["kind"] is None and step["compensation"]["none_reason"] for step in steps)


def test_refund_with_notice_completes_with_the_notice_last(world: World, agent_actor: Actor, manager: Any) -> None:
    workflow = workflow_propose(
        template="refund_with_notice", parameters=refund_parameters(), proposer=agent_actor
    ).workflow
    if workflow.state == W.PROPOSED:
        plan_decide(workflow_pk=workflow.pk, user=manager, decision="approve")
    assert world.run(workflow.workflow_id) == W.COMPLETED
    assert [key.rsplit(":", 1)[1] for key, _ in world.effects] == ["refund", "notify_customer"]
    notice = Action.objects.get(action_id=f"{workflow.workflow_id}:notify_customer")
    assert notice.payload["to"] == "carla@example.com" and "30.00 EUR" in notice.payload["body"]


def test_every_workflow_state_change_writes_an_event(world: World, agent_actor: Actor, manager: Any) -> None:
    """Invariant 9, for workflows: the trail holds each state the workflow passed through."""
    approved_po(world, agent_actor, manager)
    world.run(PO)
    changes = [
        (e.from_state, e.to_state)
        for e in WorkflowEvent.objects.filter(workflow__workflow_id=PO).order_by("pk")
        if e.from_state != e.to_state
    ]
    assert changes == [
        ("", W.PROPOSED),
        (W.PROPOSED, W.AUTHORIZED),
        (W.AUTHORIZED, W.RUNNING),
        (W.RUNNING, W.COMPLETED),
    ]


def test_a_credit_note_voided_by_a_compensation_whose_outcome_is_pending_is_not_a_missing_effect(
    world: World, agent_actor: Actor, manager: Any, settings: Any
) -> None:
    """Invariant 2 against the receiver's ledger, seen once in a CI chaos run: the void reached
    the accounting system, its answer was lost, and the void waited for a person while the audit
    ran. The credit note is voided at the receiver and its step is SUCCEEDED in the console: the
    compensation in flight accounts for it. A void that failed for good, or was never sent, does
    not."""
    world.script[f"{PO}:email_supplier"] = Outcome.FAILED_FINAL
    world.script[f"{PO}:post_credit_note:compensate"] = Outcome.UNKNOWN
    approved_po(world, agent_actor, manager)
    assert world.run(PO) == W.COMPENSATING
    note = Action.objects.get(action_id=f"{PO}:post_credit_note")
    void = Action.objects.get(action_id=f"{PO}:post_credit_note:compensate")
    assert note.status == S.SUCCEEDED and void.status == S.UNKNOWN and void.attempt_count == 1
    voided = Effect(
        reference=note.provider_reference,
        status="VOIDED",
        outcome=Outcome.FAILED_FINAL,
        amount_minor=2000,
        currency="EUR",
        action_id=note.action_id,
    )

    # The audit checks invariant 2 only for a deployment with an accounting system to read.
    settings.ACCOUNTING_API_BASE = "http://accounting.invalid"

    def violations_for_the_note() -> list[int]:
        return [v.invariant for v in check_effects(ledger=[voided]).violations if v.subject == note.action_id]

    assert violations_for_the_note() == []
    Action.objects.filter(pk=void.pk).update(status=S.NEEDS_REVIEW)
    assert violations_for_the_note() == []
    # The void failed for good: nothing the console did explains the voided note.
    Action.objects.filter(pk=void.pk).update(status=S.FAILED_FINAL)
    assert violations_for_the_note() == [2]
    # Never sent: nor does a void that is only queued, even after a send the relay refused.
    Action.objects.filter(pk=void.pk).update(status=S.AUTHORIZED, attempt_count=0)
    assert violations_for_the_note() == [2]
    Action.objects.filter(pk=void.pk).update(status=S.AUTHORIZED, attempt_count=1)
    assert violations_for_the_note() == [2]
    # Sent and succeeded: accounted for.
    Action.objects.filter(pk=void.pk).update(status=S.SUCCEEDED, attempt_count=1)
    assert violations_for_the_note() == []


def _plan_expires_while_the_credit_note_is_unknown(
    world: World, agent_actor: Actor, manager: Any, finance: Any
) -> Action:
    """The credit note's outcome is unknown long enough for the plan's approval to expire; then
    reconciliation finds it posted. The supplier email, not started yet, is no longer covered."""
    world.script[f"{PO}:post_credit_note"] = Outcome.UNKNOWN
    approved_po(world, agent_actor, manager)
    assert world.run(PO) == W.PAUSED
    WorkflowApproval.objects.filter(workflow__workflow_id=PO).update(expires_at=timezone.now() - timedelta(minutes=1))
    # Reconciliation, when next due, finds the credit note at the receiver.
    note = Action.objects.get(action_id=f"{PO}:post_credit_note")
    Action.objects.filter(pk=note.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    reconcile_action(action_pk=note.pk, receiver=send.receiver_for(note))
    assert Action.objects.get(pk=note.pk).status == S.SUCCEEDED
    assert world.run(PO) == W.PAUSED
    email = Action.objects.get(action_id=f"{PO}:email_supplier")
    assert email.status == S.PROPOSED and not Approval.objects.filter(action=email).exists()
    assert world.effects_for(f"{PO}:email_supplier") == 0
    return email


def test_a_step_whose_plan_approval_expired_waits_in_the_managers_inbox_and_runs_once_approved(
    world: World, agent_actor: Actor, manager: Any, finance: Any, second_manager: Any
) -> None:
    """Liveness (invariant 8): a workflow must not wait for a decision nobody was asked to make.
    The step the expired approval no longer covers is proposed on its own: it is in the managers'
    inbox and their waiting count, the workflow says where, and approving it runs it once."""
    email = _plan_expires_while_the_credit_note_is_unknown(world, agent_actor, manager, finance)
    # Advanced again meanwhile (a nudge, the sweep): it keeps saying why and where it waits.
    assert world.run(PO) == W.PAUSED
    workflow = Workflow.objects.get(workflow_id=PO)
    assert "managers' inbox" in workflow.waiting_for and "expired" in workflow.waiting_for
    assert "rejecting it walks back" in workflow.waiting_for
    assert "step_proposed" in set(WorkflowEvent.objects.filter(workflow=workflow).values_list("transition", flat=True))
    inbox = proposal_inbox_get(user=second_manager)
    assert email.pk in {row.action.pk for row in inbox.waiting}
    assert waiting_count_for(second_manager, {"manager"}) >= 1
    # Somebody who may decide it exists, so the liveness audit finds nothing waiting in vain.
    assert not [v for v in check_effects(ledger=[]).violations if v.subject == email.action_id]

    approval_decide(action_pk=email.pk, user=second_manager, decision="approve", note="Still right.")
    assert world.run(PO) == W.COMPLETED
    assert world.effects_for(f"{PO}:email_supplier") == 1
    assert not [key for key, _ in world.effects if key.endswith(":compensate")]


def test_a_step_whose_plan_approval_expired_and_is_rejected_walks_back_the_completed_steps(
    world: World, agent_actor: Actor, manager: Any, finance: Any, second_manager: Any
) -> None:
    email = _plan_expires_while_the_credit_note_is_unknown(world, agent_actor, manager, finance)
    approval_decide(action_pk=email.pk, user=second_manager, decision="reject", note="Too late now.")
    assert world.run(PO) == W.COMPENSATED
    assert world.effects_for(f"{PO}:email_supplier") == 0
    assert [key for key, _ in world.effects if key.endswith(":compensate")] == [f"{PO}:post_credit_note:compensate"]
