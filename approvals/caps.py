"""Caps on autonomy: how much the auto-approval policy may approve with no person involved.

The threshold alone let an agent empty an order in small pieces (13 auto-approved refunds of
25.00 EUR or less in 25 seconds). Past any of these caps a proposal waits for a manager:

- per target (the order of a refund, the supplier bill of an invoice adjustment): the total
  amount, and the number of actions, auto-approved within the cap's window;
- per agent: the total amount auto-approved for the agent's proposals within a day (the cap's
  window), per currency.

The caps are policy data (``AutoApprovalCap`` rows, edited in the admin and written to the
security trail), with defaults in the settings. ``auto_approval_cap_refusal`` decides and
changes nothing: the auto-approval policy calls it before approving, inside its transaction,
after ``auto_approval_cap_lock`` has locked the rows that serialise concurrent decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import F, Func, QuerySet, Subquery

from actions.models import Action, ActionEvent, Agent, Bill, Order
from actions.trail import Actor, Writes, event_record
from approvals.models import Approval, ApprovalPolicy, AutoApprovalCap, CapScope, Decision

# The audit event the policy writes when a cap leaves a proposal to a manager; the inbox card
# shows its reason (approvals/selectors.py).
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


def _auto_approved(*, since: datetime, until: datetime, exclude: Action) -> QuerySet[Action]:
    """Actions auto-approved since ``since``, each counted once (a reopened action may hold
    two approvals), other than the one being decided."""
    approved = Approval.objects.filter(
        policy=ApprovalPolicy.AUTO, decision=Decision.APPROVE, decided_at__gte=since, decided_at__lte=until
    ).values("action_id")
    return Action.objects.filter(pk__in=approved).exclude(pk=exclude.pk)


def _aggregate(rows: QuerySet[Action], function: str, column: str) -> Subquery:
    """``function(column)`` over all of ``rows``, as a scalar subquery (NULL when there are none)."""
    return Subquery(rows.order_by().annotate(value=Func(F(column), function=function)).values("value")[:1])


def auto_approval_cap_refusal(*, action: Action, now: datetime) -> str | None:
    """Why the auto-approval policy must leave ``action`` to a manager, or None within every cap.

    The text is for the manager's card, e.g. "Auto-approval cap for order 4821 reached: ...".
    A currency with no cap configured has no auto-approval at all (fail closed).
    """
    currency = action.currency
    amount = action.amount

    caps = caps_for(currency=currency)
    target = caps[CapScope.TARGET]
    # The target is the order of a refund or the bill of an invoice adjustment: many small
    # credit notes on one bill add up just as many small refunds on one order do.
    if action.order_id is not None:
        noun, plural = "order", "refunds"
        number: object = action.order.number if action.order is not None else action.order_id
        same_target = {"order_id": action.order_id}
    elif action.bill_id is not None:
        noun, plural = "bill", "adjustments"
        number = action.bill.number if action.bill is not None else action.bill_id
        same_target = {"bill_id": action.bill_id}
    else:
        same_target = {}
    agent_cap = caps[CapScope.AGENT] if action.proposed_by_agent_id is not None else None
    if same_target and target.max_amount is None:
        return f"No auto-approval cap is configured for {currency} per {noun}, so a manager decides."

    # The target's and the agent's totals, each the query it was on its own, in one statement
    # (issue 18): scalar subqueries read as columns of a row the lock above holds, the agent's
    # or else the target's (a plain read after the lock, so they see every commit before it).
    totals: dict[str, Subquery] = {}
    if same_target:
        on_target = _auto_approved(since=now - target.window, until=now, exclude=action).filter(**same_target)
        totals["target_total"] = _aggregate(on_target, "SUM", "amount")
        totals["target_count"] = _aggregate(on_target, "COUNT", "pk")
    if agent_cap is not None and agent_cap.max_amount is not None:
        by_agent = _auto_approved(since=now - agent_cap.window, until=now, exclude=action).filter(
            proposed_by_agent_id=action.proposed_by_agent_id, currency=currency
        )
        totals["agent_total"] = _aggregate(by_agent, "SUM", "amount")
    found: dict[str, Any] = {}
    if totals:
        if action.proposed_by_agent_id is not None:
            anchor: QuerySet[Any] = Agent.objects.filter(pk=action.proposed_by_agent_id)
        elif action.order_id is not None:
            anchor = Order.objects.filter(pk=action.order_id)
        else:
            assert action.bill_id is not None  # totals are read only for a target or an agent
            anchor = Bill.objects.filter(pk=action.bill_id)
        found = anchor.values(**totals).get()

    if same_target:
        assert target.max_amount is not None
        total = found["target_total"] or Decimal("0")
        count = found["target_count"] or 0
        hours = int(target.window.total_seconds() // 3600)
        if target.max_count is not None and count + 1 > target.max_count:
            return (
                f"Auto-approval cap for {noun} {number} reached: {count} {plural} were auto-approved on it in the "
                f"last {hours} h (at most {target.max_count}). A manager decides this one."
            )
        if total + amount > target.max_amount:
            return (
                f"Auto-approval cap for {noun} {number} reached: {total} {currency} was auto-approved on it in the "
                f"last {hours} h, and {amount} {currency} more would pass the cap of {target.max_amount} {currency}. "
                "A manager decides this one."
            )

    if agent_cap is not None:
        if agent_cap.max_amount is None:
            return f"No auto-approval cap is configured for {currency} per agent, so a manager decides."
        total = found["agent_total"] or Decimal("0")
        if total + amount > agent_cap.max_amount:
            hours = int(agent_cap.window.total_seconds() // 3600)
            return (
                f"Auto-approval cap for this agent reached: {total} {currency} of its proposals was auto-approved in "
                f"the last {hours} h, and {amount} {currency} more would pass the cap of {agent_cap.max_amount} "
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
