from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import reverse

from actions.agents.webhooks import agents_owned_summary
from actions.notifications import notifications_unread_count, waiting_count_for
from approvals.selectors.plans import manager_waiting_counts
from console.roles import user_roles


def _manager_waiting_href(user: Any) -> str:
    """Where a manager's count of waiting work leads: to the plans when only plans wait (the
    inbox of single proposals would look empty), else to the inbox, whose Plans tab counts them."""
    proposals, plans = manager_waiting_counts(user=user)
    return reverse("approvals-workflows") if plans and not proposals else reverse("approvals-inbox")


def nav_section(request: HttpRequest) -> str:
    """The part of the console a page belongs to, which the navigation highlights: the first
    segment of its address ("approvals" for the inbox, a proposal, the plans and each plan;
    "review" for the queue and everything under it; "home" for the home page). A page no
    address matched (a 404) belongs to none."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return ""
    return str(match.route).split("/", 1)[0] or "home"


def roles(request: HttpRequest) -> dict[str, Any]:
    """Which navigation the base layout shows."""
    names = user_roles(request.user)
    return {
        "roles": names,
        "nav_section": nav_section(request),
        "is_manager": "manager" in names,
        # Accounts payable works the same review queue, for invoice adjustments.
        "is_finance": "finance" in names or "accounts payable" in names,
        "is_console_admin": "admin" in names or getattr(request.user, "is_superuser", False),
        # Counted only if the page shows the badge (the template calls it), once per render.
        "nav_waiting_count": lambda: waiting_count_for(request.user, names),
        # The bell: this person's unread notifications (counted only where the layout shows it).
        "nav_unread_notifications": lambda: notifications_unread_count(request.user),
        "nav_manager_href": lambda: _manager_waiting_href(request.user),
        # The Plans tab's count, read only on the pages that show the tabs.
        "plans_waiting_count": lambda: manager_waiting_counts(user=request.user)[1],
        # The agents this person owns, for their home page (only queried where it is shown).
        "owned_agents": lambda: agents_owned_summary(request.user),
    }
