"""Roles are Django groups with fixed permissions, created after every migrate.

- agent: proposes actions (agents themselves use API tokens; the group is for console users
  who propose by hand).
- manager: approves, rejects, cancels and reopens proposals.
- finance: resolves actions that need review; works remedies and discrepancies.
- admin: corrects through the admin site. Separation of duties: admins do not approve,
  resolve, issue agent tokens (only an agent's owner does, on the account page), own agents,
  or advance remedies and discrepancies (they read and reassign them).
- accounts payable: resolves invoice adjustments (and credit-note voids) that need review.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission

from actions import permissions as perms

AGENT, MANAGER, FINANCE, ADMIN = "agent", "manager", "finance", "admin"
# Accounts payable owns invoice adjustments that need a person: supplier bills and credit notes.
ACCOUNTS_PAYABLE = "accounts payable"
ROLES = (AGENT, MANAGER, FINANCE, ADMIN, ACCOUNTS_PAYABLE)

_VIEW = [
    "actions.view_order",
    "actions.view_refundrequest",
    "actions.view_action",
    "actions.view_actionevent",
    "actions.view_attempt",
    "approvals.view_approval",
    "actions.view_ledgerauditrun",
    "actions.view_bill",
    "actions.view_adjustmentrequest",
]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    AGENT: [perms.PROPOSE, "actions.view_order", "actions.view_action"],
    MANAGER: [*_VIEW, perms.DECIDE, perms.CANCEL],
    FINANCE: [
        *_VIEW,
        perms.RESOLVE,
        "actions.view_remedy",
        "actions.change_remedy",
        "actions.view_discrepancy",
        "actions.change_discrepancy",
    ],
    # Resolves invoice adjustments and credit-note voids that need review, like finance does
    # for refunds; it sees the bills they draw on.
    ACCOUNTS_PAYABLE: [
        *_VIEW,
        perms.RESOLVE,
        "actions.view_bill",
        "actions.view_adjustmentrequest",
        "actions.view_discrepancy",
        "actions.change_discrepancy",
    ],
    ADMIN: [
        *_VIEW,
        perms.CORRECT,
        perms.CANCEL,
        "actions.change_order",
        "actions.add_order",
        "actions.add_refundrequest",
        "actions.change_refundrequest",
        "actions.view_agent",
        "actions.add_agent",
        "actions.change_agent",
        # Tokens: seeing and revoking (a kill switch), never issuing: only an agent's owner
        # issues its tokens, on the owner page (separation of duties).
        "actions.view_agenttoken",
        "actions.change_agenttoken",
        # Follow-ups: reading and reassigning (actions.correct_action), never advancing.
        "actions.view_remedy",
        "actions.view_discrepancy",
        "actions.view_ownergroup",
        "actions.view_securityevent",
        "approvals.view_autoapprovalcap",
        "approvals.add_autoapprovalcap",
        "approvals.change_autoapprovalcap",
        "approvals.delete_autoapprovalcap",
        "actions.add_ownergroup",
        "actions.change_ownergroup",
        "approvals.view_approvallimit",
        "approvals.add_approvallimit",
        "approvals.change_approvallimit",
        "approvals.delete_approvallimit",
        # Changes to limits and caps take effect once finance confirms them; the admin reads them.
        "approvals.view_policychange",
        # Viewing only: with auth.change_user the admin role could grant itself any group or
        # superuser status, defeating four eyes. Users and roles are managed by a superuser.
        "auth.view_user",
        "auth.view_group",
    ],
}


def ensure_roles(sender: Any = None, **kwargs: Any) -> None:
    if sender is not None and getattr(sender, "label", None) != "approvals":
        return
    for role, granted in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        wanted = []
        for dotted in granted:
            app_label, codename = dotted.split(".")
            perm = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if perm is not None:
                wanted.append(perm)
        group.permissions.set(wanted)


def user_roles(user: Any) -> set[str]:
    if not getattr(user, "is_authenticated", False):
        return set()
    cached = getattr(user, "_console_roles", None)
    if cached is None:
        cached = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        user._console_roles = cached
    return cached
