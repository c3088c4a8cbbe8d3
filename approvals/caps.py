"""Caps on autonomy: how much the auto-approval policy may approve with no person involved.

The threshold alone let an agent empty an order in small pieces (13 auto-approved refunds of
25.00 EUR or less in 25 seconds). Past any of these caps a proposal waits for a manager:

- per target (the order of a refund, the supplier bill of an invoice adjustment): the total
  amount, and the number of actions, auto-approved within the cap's window;
- per agent: the total amount auto-approved for the agent's proposals within a day (the cap's
  window), per currency.

The caps are policy data (``AutoApprovalCap`` rows, proposed in the admin and in force once a
member of finance confirms them, approvals/policy_changes.py), with defaults in the settings.
``auto_approval_cap_refusal`` decides and changes nothing: the auto-approval policy calls it
before approving, inside its transaction, after ``auto_approval_cap_lock`` has locked the rows
that serialise concurrent decisions. Both doors call the pair: a lone proposal
(``approvals.policy``) and a workflow's plan, for each of its money steps
(``actions.workflows.services``).

What counts as auto-approved: every action with an auto-approval, and every money step of a
plan the policy approved whose action the coordinator has not created yet (the plan's approval
binds its target, amount and currency). Without the second, plans proposed together were each
approved against a count that none of them had reached yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Exists, F, Func, QuerySet, Subquery

from actions.foundation.trail import Actor, Writes, event_record
from actions.models import Action, ActionEvent, Agent, Bill, Order, WorkflowState, WorkflowStep
from approvals.models import Approval, ApprovalPolicy, AutoApprovalCap, CapScope, Decision, WorkflowApproval

# The audit event the policy writes when a cap leaves a proposal to a manager; the inbox card
# shows its reason (approvals/selectors/rows.py).
AUTO_APPROVAL_HELD = "auto_approval_held"


@dataclass(frozen=True)
class Cap:
    max_amount: Decimal | None
    max_count: int | None
    window: timedelta


def cap_for(*, scope: str, currency: str) -> Cap:
    """The cap for a scope and currency: the admin's row if there is one, else the settings'."""
    return caps_for(currency=currency)[scope]


def caps_for(*, currency: str) -> dict[str, Cap]:
    """The caps of every scope for a currency, in one read (the policy checks both on every
    auto-approval)."""
    rows = {row.scope: row for row in AutoApprovalCap.objects.filter(currency=currency)}
    return {scope: _cap(scope=scope, currency=currency, row=rows.get(scope)) for scope in CapScope.values}


def _cap(*, scope: str, currency: str, row: AutoApprovalCap | None) -> Cap:
    if row is not None:
        return Cap(row.max_amount, row.max_count, timedelta(hours=row.window_hours))
    if scope == CapScope.TARGET:
        return Cap(
            settings.AUTO_APPROVAL_TARGET_MAX_AMOUNTS.get(currency),
            settings.AUTO_APPROVAL_TARGET_MAX_COUNT,
            timedelta(hours=settings.AUTO_APPROVAL_TARGET_WINDOW_HOURS),
        )
    return Cap(settings.AUTO_APPROVAL_AGENT_DAILY_AMOUNTS.get(currency), None, timedelta(days=1))


def _auto_approved(*, since: datetime, exclude: Action) -> QuerySet[Action]:
    """Actions auto-approved since ``since``, each counted once (a reopened action may hold
    two approvals), other than the one being decided.

    No upper bound at the decision's ``now``: a proposal takes its ``now`` before it waits for
    the lock, so a concurrent auto-approval that committed while it waited is stamped a moment
    after that ``now``, and must count (bounded by ``now``, three refunds proposed together on
    one order were all auto-approved, above the cap of 2)."""
    approved = Approval.objects.filter(
        policy=ApprovalPolicy.AUTO, decision=Decision.APPROVE, decided_at__gte=since
    ).values("action_id")
    return Action.objects.filter(pk__in=approved).exclude(pk=exclude.pk)


# A plan in one of these states may still create its approved steps' actions; a finished one,
# or one walking back its steps, creates no more forward steps.
_PLAN_GOES_ON = (WorkflowState.AUTHORIZED, WorkflowState.RUNNING, WorkflowState.PAUSED)


@dataclass(frozen=True)
class PlannedStep:
    """A money step of an auto-approved plan that has no action yet: what its approval binds."""

    target: dict[str, str]  # as the plan names it: {"type": "order", "ref": "4821"}
    amount: Decimal
    currency: str
    agent_id: int | None
    decided_at: datetime


def _plans_auto_approved(*, since: datetime) -> QuerySet[WorkflowApproval]:
    """Auto-approvals of plans that go on and still have a step with no action (no upper bound:
    see ``_auto_approved``)."""
    return WorkflowApproval.objects.filter(
        policy=ApprovalPolicy.AUTO,
        decision=Decision.APPROVE,
        decided_at__gte=since,
        workflow__state__in=_PLAN_GOES_ON,
        workflow__steps__action__isnull=True,
    )


def _planned_steps(*, since: datetime) -> list[PlannedStep]:
    """The money steps of auto-approved plans whose actions are not created yet. Once the
    coordinator creates one, it carries its own auto-approval (counted by ``_auto_approved``)
    and its step points at it, in one transaction, so a step is never counted twice or missed."""
    approvals = list(_plans_auto_approved(since=since).distinct().select_related("workflow"))
    waiting = set(
        WorkflowStep.objects.filter(
            workflow_id__in=[approval.workflow_id for approval in approvals], action__isnull=True
        ).values_list("workflow_id", "name")
    )
    return [
        PlannedStep(
            target=binding.get("target") or {},
            amount=Decimal(binding["amount"]),
            currency=str(binding.get("currency") or ""),
            agent_id=approval.workflow.proposed_by_agent_id,
            decided_at=approval.decided_at,
        )
        for approval in approvals
        for binding in approval.bindings
        if binding.get("amount") and (approval.workflow_id, binding.get("step")) in waiting
    ]


def _aggregate(rows: QuerySet[Action], function: str, column: str) -> Subquery:
    """``function(column)`` over all of ``rows``, as a scalar subquery (NULL when there are none)."""
    return Subquery(rows.order_by().annotate(value=Func(F(column), function=function)).values("value")[:1])


@dataclass(frozen=True)
class _CapTarget:
    """What an action's target cap counts over: the order of a refund or the bill of an invoice
    adjustment (many small credit notes on one bill add up just as many small refunds on one
    order do)."""

    noun: str
    plural: str
    number: object
    same_target: dict[str, Any]


def _cap_target(action: Action) -> _CapTarget | None:
    if action.order_id is not None:
        number: object = action.order.number if action.order is not None else action.order_id
        return _CapTarget("order", "refunds", number, {"order_id": action.order_id})
    if action.bill_id is not None:
        number = action.bill.number if action.bill is not None else action.bill_id
        return _CapTarget("bill", "adjustments", number, {"bill_id": action.bill_id})
    return None


def auto_approval_cap_refusal(*, action: Action, now: datetime) -> str | None:
    """Why the auto-approval policy must leave ``action`` to a manager, or None within every cap.

    The text is for the manager's card, e.g. "Auto-approval cap for order 4821 reached: ...".
    A currency with no cap configured has no auto-approval at all (fail closed).
    """
    caps = caps_for(currency=action.currency)
    target_cap = caps[CapScope.TARGET]
    target = _cap_target(action)
    agent_cap = caps[CapScope.AGENT] if action.proposed_by_agent_id is not None else None
    if target is not None and target_cap.max_amount is None:
        return f"No auto-approval cap is configured for {action.currency} per {target.noun}, so a manager decides."
    found, planned = _auto_approved_so_far(
        action=action, target=target, target_cap=target_cap, agent_cap=agent_cap, now=now
    )
    if target is not None:
        refusal = _target_cap_refusal(
            action=action, target=target, cap=target_cap, found=found, planned=planned, now=now
        )
        if refusal is not None:
            return refusal
    if agent_cap is not None:
        return _agent_cap_refusal(action=action, cap=agent_cap, found=found, planned=planned, now=now)
    return None


def _auto_approved_so_far(
    *, action: Action, target: _CapTarget | None, target_cap: Cap, agent_cap: Cap | None, now: datetime
) -> tuple[dict[str, Any], list[PlannedStep]]:
    """The target's and the agent's totals auto-approved in their windows, and the money steps of
    auto-approved plans not created yet.

    The totals are each the query they were on their own, in one statement: scalar subqueries
    read as columns of a row the lock above holds, the agent's or else the target's (a plain read
    after the lock, so they see every commit before it)."""
    totals: dict[str, Subquery] = {}
    windows = ([target_cap.window] if target is not None else []) + (
        [agent_cap.window] if agent_cap is not None else []
    )
    if target is not None:
        on_target = _auto_approved(since=now - target_cap.window, exclude=action).filter(**target.same_target)
        totals["target_total"] = _aggregate(on_target, "SUM", "amount")
        totals["target_count"] = _aggregate(on_target, "COUNT", "pk")
    if agent_cap is not None and agent_cap.max_amount is not None:
        by_agent = _auto_approved(since=now - agent_cap.window, exclude=action).filter(
            proposed_by_agent_id=action.proposed_by_agent_id, currency=action.currency
        )
        totals["agent_total"] = _aggregate(by_agent, "SUM", "amount")
    if not totals:
        return {}, []
    # Whether any auto-approved plan still has steps to create, in the same statement: the
    # plans' steps are read only when there are some (rarely), so a lone proposal reads no more.
    totals["plans_waiting"] = Exists(_plans_auto_approved(since=now - max(windows)))
    if action.proposed_by_agent_id is not None:
        anchor: QuerySet[Any] = Agent.objects.filter(pk=action.proposed_by_agent_id)
    elif action.order_id is not None:
        anchor = Order.objects.filter(pk=action.order_id)
    else:
        assert action.bill_id is not None  # totals are read only for a target or an agent
        anchor = Bill.objects.filter(pk=action.bill_id)
    found = anchor.values(**totals).get()
    planned = _planned_steps(since=now - max(windows)) if found.get("plans_waiting") else []
    return found, planned


def _target_cap_refusal(
    *, action: Action, target: _CapTarget, cap: Cap, found: dict[str, Any], planned: list[PlannedStep], now: datetime
) -> str | None:
    assert cap.max_amount is not None
    currency, amount, noun, number, plural = action.currency, action.amount, target.noun, target.number, target.plural
    on_plans = [
        step
        for step in planned
        if step.target == {"type": noun, "ref": str(number)} and step.decided_at >= now - cap.window
    ]
    total = (found["target_total"] or Decimal("0")) + sum(
        (step.amount for step in on_plans if step.currency == currency), Decimal("0")
    )
    count = (found["target_count"] or 0) + len(on_plans)
    hours = int(cap.window.total_seconds() // 3600)
    in_plans = (
        f" {len(on_plans)} of the auto-approved {plural} are steps of workflow plans still to run." if on_plans else ""
    )
    if cap.max_count is not None and count + 1 > cap.max_count:
        return (
            f"Auto-approval cap for {noun} {number} reached: {count} {plural} were auto-approved on it in the "
            f"last {hours} h (at most {cap.max_count}).{in_plans} A manager decides this one."
        )
    if total + amount > cap.max_amount:
        return (
            f"Auto-approval cap for {noun} {number} reached: {total} {currency} was auto-approved on it in the "
            f"last {hours} h, and {amount} {currency} more would pass the cap of {cap.max_amount} {currency}."
            f"{in_plans} A manager decides this one."
        )
    return None


def _agent_cap_refusal(
    *, action: Action, cap: Cap, found: dict[str, Any], planned: list[PlannedStep], now: datetime
) -> str | None:
    currency, amount = action.currency, action.amount
    if cap.max_amount is None:
        return f"No auto-approval cap is configured for {currency} per agent, so a manager decides."
    total = (found["agent_total"] or Decimal("0")) + sum(
        (
            step.amount
            for step in planned
            if step.agent_id == action.proposed_by_agent_id
            and step.currency == currency
            and step.decided_at >= now - cap.window
        ),
        Decimal("0"),
    )
    if total + amount > cap.max_amount:
        hours = int(cap.window.total_seconds() // 3600)
        return (
            f"Auto-approval cap for this agent reached: {total} {currency} of its proposals was auto-approved in "
            f"the last {hours} h, and {amount} {currency} more would pass the cap of {cap.max_amount} "
            f"{currency}. A manager decides this one."
        )
    return None


def auto_approval_cap_lock(*, action: Action, writes: Writes | None = None) -> None:
    """Lock the target (order or bill) and the proposing agent (in that order), so that two
    auto-approvals on the same target or by the same agent are decided one after the other and
    cannot both fit under a cap that only one of them fits. Call inside the policy's
    transaction, before ``auto_approval_cap_refusal``. ``writes``: the proposal's, which keeps
    the agent's webhook, read with its row, for its events' outbox rows."""
    if action.order_id is not None:
        list(Order.objects.select_for_update().filter(pk=action.order_id).values_list("pk", flat=True))
    if action.bill_id is not None:
        list(Bill.objects.select_for_update().filter(pk=action.bill_id).values_list("pk", flat=True))
    if action.proposed_by_agent_id is not None:
        # The agent's webhook comes with its row (a LEFT JOIN; only the agent is locked): the
        # proposal's events would read it next, for their outbox rows (one read fewer).
        agent = (
            Agent.objects.select_for_update(of=("self",))
            .select_related("webhook")
            .only("pk", "webhook__id", "webhook__agent_id", "webhook__is_active")
            .get(pk=action.proposed_by_agent_id)
        )
        if writes is not None:
            hook = getattr(agent, "webhook", None)
            writes.webhooks[agent.pk] = hook.pk if hook is not None and hook.is_active else None


def auto_approval_held_record(
    *, action: Action, reason: str, now: datetime | None = None, writes: Writes | None = None
) -> ActionEvent:
    """Write, in the policy's transaction, that a cap left ``action`` to a manager. The status
    does not change (PROPOSED to PROPOSED, so no agent webhook); the inbox card shows ``reason``.
    Inside a proposal it is inserted with the proposal's event, after it (``writes``)."""
    return event_record(
        action=action,
        transition=AUTO_APPROVAL_HELD,
        from_state=action.status,
        actor=Actor.system("auto-approval"),
        reason=reason,
        evidence={"policy": "auto_approval_caps"},
        now=now,
        writes=writes,
    )
