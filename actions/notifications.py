"""Notifications by e-mail: proposals waiting for managers, items escalated to their owners,
items overdue, and changes to limits and caps waiting for finance to confirm them. Beat runs
``notifications_send_due`` every NOTIFICATION_INTERVAL_SECONDS.

Each notification is sent once per item and person: a ``NotificationSent`` row per item is
inserted in the transaction that sends the mail. Its unique constraint makes a second run (or
two at once: the second insert waits for the first commit, then fails) skip what was sent;
a mail that cannot be sent rolls its rows back, so the next run tries again.

Every notification goes two ways, decided once (``_send_once``): a row in the console
(``Notification``, under the bell in the navigation, ``/notifications/``) and an e-mail with a
plain-text and an HTML part, each item with an absolute link (``CONSOLE_BASE_URL``). A person with
no address on file still finds the notification in the console.

Each person chooses on their account page (``UserSettings``) which of these they receive,
except the changes to limits and caps: those are a control (four eyes), so every member of
finance who may confirm one is told.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from actions.models import (
    Action,
    ActionStatus,
    Discrepancy,
    DiscrepancyStatus,
    FollowUpStatus,
    Notification,
    NotificationKind,
    NotificationSent,
    Remedy,
    UserSettings,
    Workflow,
)
from actions.plain import action_words
from approvals.four_eyes import policy_change_refusal
from approvals.models import PolicyChange, PolicyChangeStatus
from approvals.selectors.plans import manager_waiting_counts, plan_subject, plans_waiting, proposals_waiting

MANAGER_ROLE = "manager"
FINANCE_ROLE = "finance"
OPEN_DISCREPANCY = (DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS)
OPEN_REMEDY = (FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS)
# One mail lists at most this many items; the rest go in the next run's mail.
ITEMS_PER_MAIL = 50


@dataclass(frozen=True)
class Item:
    subject: str  # "action:12", "remedy:3", "discrepancy:7"
    line: str
    link: str  # the item's page, a path in the console


def absolute_link(path: str) -> str:
    """The console's address for a path, for a mail read outside the console."""
    return settings.CONSOLE_BASE_URL.rstrip("/") + path


@dataclass
class NotificationRun:
    sent: int = 0  # mails
    items: int = 0  # items told about

    def told(self, count: int) -> None:
        """One person was told of ``count`` new items, in one mail (none when there were none)."""
        self.items += count
        self.sent += 1 if count else 0


# What each kind's mail says: its subject ("{count}" is the number of items) and its first line
# ("{minutes}", where there is one, is how long a proposal has waited).
_MAIL_WORDS: dict[str, tuple[str, str]] = {
    NotificationKind.WAITING_PROPOSAL: (
        "{count} proposal(s) waiting for a decision",
        "These proposals have waited more than {minutes} minutes for a manager:",
    ),
    NotificationKind.OVERDUE: (
        "{count} item(s) you own are overdue",
        "These items you own are past their due time:",
    ),
    NotificationKind.ESCALATED: (
        "{count} item(s) escalated to you",
        "These items were handed to you to resolve in the review queue:",
    ),
    NotificationKind.POLICY_CHANGE: (
        "{count} change(s) to approval limits or caps waiting for your confirmation",
        "These changes were proposed in the admin site. They take effect only when a member of finance "
        "other than the proposer confirms them. Confirm or reject each from its link.",
    ),
    NotificationKind.TRAIL_BREAK: (
        "The audit trail's check found {count} break(s)",
        "The periodic check of the audit trail (manage.py verify_trail) found events or checkpoints "
        "that no longer match their hashes. Keep the database as it is and tell an administrator:",
    ),
}


def _settings_of(users: list[Any]) -> dict[int, UserSettings]:
    found = {s.user_id: s for s in UserSettings.objects.filter(user__in=users)}
    # Someone who never saved the form gets the defaults, without a row being written.
    return {user.pk: found.get(user.pk) or UserSettings(user=user) for user in users}


# Each item is named as a clerk knows it (kind, money, the order or bill and whose it is); the
# action's id stays behind the link, on the item's page and in its technical details.


def _remedy_line(remedy: Remedy) -> str:
    # What the customer still expects back, which is the failed action's amount unless finance
    # changed it.
    if remedy.action is None:
        return f"Remedy · {remedy.amount} {remedy.currency}"
    return f"Remedy of {remedy.amount} {remedy.currency} for: {action_words(remedy.action)}"


def _discrepancy_line(found: Discrepancy) -> str:
    words = f"Discrepancy: {found.get_kind_display()}"
    if found.action is not None:
        return f"{words} · {action_words(found.action)}"
    # An effect no action asked for is known only by the receiver's reference.
    return f"{words} · {found.provider_reference}" if found.provider_reference else words


def _plan_line(workflow: Workflow) -> str:
    subject = plan_subject(workflow.parameters)
    return f"Plan for {subject}" if subject else "Plan"


def _send_once(*, user: Any, kind: str, items: list[Item], now: datetime, **intro_fields: object) -> int:
    """Tell one person about the items not yet told to them, in the words of the kind's mail
    (``intro_fields`` fill its first line); returns how many were new.

    This is the one place where a decision to tell someone becomes its channels: the
    console's notification rows and, where the person has an address, one e-mail.
    """
    if not items:
        return 0
    with transaction.atomic():
        fresh: list[Item] = []
        for item in items[:ITEMS_PER_MAIL]:
            try:
                with transaction.atomic():
                    NotificationSent.objects.create(user=user, kind=kind, subject=item.subject, sent_at=now)
            except IntegrityError:
                continue
            fresh.append(item)
        if not fresh:
            return 0
        Notification.objects.bulk_create(
            Notification(recipient=user, kind=kind, title=item.line[:300], link=item.link, created_at=now)
            for item in fresh
        )
        if user.email:
            subject_line, intro = _MAIL_WORDS[kind]
            _mail(
                user=user,
                items=fresh,
                subject=subject_line.format(count=len(fresh)),
                intro=intro.format(**intro_fields),
            )
    return len(fresh)


def _mail(*, user: Any, items: list[Item], subject: str, intro: str) -> None:
    context = {
        "user": user,
        "intro": intro,
        "items": [{"line": item.line, "url": absolute_link(item.link)} for item in items],
        "notifications_url": absolute_link(reverse("notifications")),
        "account_url": absolute_link(reverse("account")) + "#notifications",
    }
    message = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string("console/notification_email.txt", context),
        from_email=settings.NOTIFICATION_EMAIL_FROM,
        to=[user.email],
        connection=get_connection(settings.NOTIFICATION_EMAIL_BACKEND),
    )
    message.attach_alternative(render_to_string("console/notification_email.html", context), "text/html")
    # Raises if the mail cannot be sent: the rows roll back and the next run tries again.
    message.send()


def _already_told(user: Any, kind: str) -> set[str]:
    return set(NotificationSent.objects.filter(user=user, kind=kind).values_list("subject", flat=True))


def _waiting_proposals(now: datetime, run: NotificationRun) -> None:
    managers = list(get_user_model().objects.filter(is_active=True, groups__name=MANAGER_ROLE).distinct())
    chosen = _settings_of(managers)
    for manager in managers:
        choice = chosen[manager.pk]
        if not choice.notify_waiting_proposals:
            continue
        told = _already_told(manager, NotificationKind.WAITING_PROPOSAL)
        since = now - timedelta(minutes=choice.waiting_minutes)
        # Four eyes: a manager cannot decide what they (or their agents) proposed, and is not told of it.
        waiting = proposals_waiting(user=manager).filter(created_at__lte=since).select_related("order", "bill")
        # A workflow's plan is one decision covering several actions: told about like a proposal.
        plans = plans_waiting(user=manager).filter(created_at__lte=since)
        items = _waiting_items(waiting, "action", action_words, "approvals-detail", told=told)
        items += _waiting_items(plans, "workflow", _plan_line, "approvals-workflow", told=told)
        run.told(
            _send_once(
                user=manager,
                kind=NotificationKind.WAITING_PROPOSAL,
                items=items,
                now=now,
                minutes=choice.waiting_minutes,
            )
        )


def _waiting_items(
    rows: QuerySet[Any], subject: str, line: Callable[[Any], str], view: str, *, told: set[str]
) -> list[Item]:
    """The first of ``rows`` waiting for a manager that they were not told of, each linked to
    its page (``view``)."""
    return [
        Item(
            f"{subject}:{row.pk}",
            f"{line(row)}, waiting since {row.created_at:%Y-%m-%d %H:%M} UTC",
            reverse(view, args=[row.pk]),
        )
        for row in rows[: ITEMS_PER_MAIL * 4]
        if f"{subject}:{row.pk}" not in told
    ]


def _owned_items(now: datetime, *, overdue: bool) -> dict[int, list[Item]]:
    """Open items by owner: escalated actions, remedies and discrepancies (only those past due
    when ``overdue``)."""
    by_owner: dict[int, list[Item]] = defaultdict(list)
    due_cut = now - timedelta(hours=settings.REVIEW_DUE_HOURS)
    actions = Action.objects.filter(status=ActionStatus.NEEDS_REVIEW, owner__isnull=False).select_related(
        "order", "bill"
    )
    remedies = Remedy.objects.filter(status__in=OPEN_REMEDY, owner__isnull=False).select_related(
        "action__order", "action__bill"
    )
    discrepancies = Discrepancy.objects.filter(status__in=OPEN_DISCREPANCY, owner__isnull=False).select_related(
        "action__order", "action__bill"
    )
    if overdue:
        actions = actions.filter(due_at__lte=now)
        remedies = remedies.filter(created_at__lte=due_cut)
        discrepancies = discrepancies.filter(detected_at__lte=due_cut)
    _add_owned(by_owner, "action", actions.order_by("due_at", "pk"), _action_line)
    _add_owned(by_owner, "remedy", remedies.order_by("created_at", "pk"), _remedy_line)
    _add_owned(by_owner, "discrepancy", discrepancies.order_by("detected_at", "pk"), _discrepancy_line)
    return by_owner


def _add_owned(by_owner: dict[int, list[Item]], subject: str, rows: QuerySet[Any], line: Callable[[Any], str]) -> None:
    """The first thousand ``rows``, each under its owner, linked to its review page ("review-<subject>")."""
    for row in rows[:1000]:
        assert row.owner_id is not None
        by_owner[row.owner_id].append(
            Item(f"{subject}:{row.pk}", line(row), reverse(f"review-{subject}", args=[row.pk]))
        )


def _action_line(action: Action) -> str:
    due = f", due {action.due_at:%Y-%m-%d %H:%M} UTC" if action.due_at else ""
    return f"{action_words(action)}{due}"


def _owner_notifications(now: datetime, run: NotificationRun, *, overdue: bool) -> None:
    by_owner = _owned_items(now, overdue=overdue)
    if not by_owner:
        return
    owners = list(get_user_model().objects.filter(pk__in=by_owner, is_active=True))
    chosen = _settings_of(owners)
    kind = NotificationKind.OVERDUE if overdue else NotificationKind.ESCALATED
    for owner in owners:
        choice = chosen[owner.pk]
        if not (choice.notify_overdue if overdue else choice.notify_escalations):
            continue
        told = _already_told(owner, kind)
        items = [item for item in by_owner[owner.pk] if item.subject not in told]
        run.told(_send_once(user=owner, kind=kind, items=items, now=now))


def _policy_changes_waiting(now: datetime, run: NotificationRun) -> None:
    """Tell each member of finance of the changes to limits and caps they may confirm."""
    waiting = list(
        PolicyChange.objects.filter(status=PolicyChangeStatus.PENDING)
        .select_related("proposed_by", "limit_user")
        .order_by("proposed_at", "pk")[: ITEMS_PER_MAIL * 4]
    )
    if not waiting:
        return
    members = get_user_model().objects.filter(is_active=True, groups__name=FINANCE_ROLE).distinct()
    link = reverse("approvals-policy-changes")
    for member in members:
        told = _already_told(member, NotificationKind.POLICY_CHANGE)
        items = [
            Item(
                f"policy_change:{change.pk}",
                f"{change.get_operation_display()} of the {change.what()}: {change.before_text()} to "
                f"{change.after_text()}, proposed by {change.proposed_by.get_username()}",
                link,
            )
            for change in waiting
            if f"policy_change:{change.pk}" not in told and policy_change_refusal(change=change, user=member) is None
        ]
        run.told(_send_once(user=member, kind=NotificationKind.POLICY_CHANGE, items=items, now=now))


def trail_break_notify(*, breaks: list[tuple[str, str, str]], now: datetime | None = None) -> int:
    """Tell every member of finance that the audit trail's check found breaks: ``breaks`` are
    (subject, line, link) triples, each told once per person. A control, like the changes to limits:
    no one opts out. Returns the number of mails sent."""
    now = now or timezone.now()
    items = [Item(subject, line, link) for subject, line, link in breaks]
    members = get_user_model().objects.filter(is_active=True, groups__name=FINANCE_ROLE).exclude(email="").distinct()
    sent = 0
    for member in members:
        count = _send_once(user=member, kind=NotificationKind.TRAIL_BREAK, items=items, now=now)
        sent += 1 if count else 0
    return sent


def notifications_send_due(*, now: datetime | None = None) -> NotificationRun:
    now = now or timezone.now()
    run = NotificationRun()
    _waiting_proposals(now, run)
    _owner_notifications(now, run, overdue=False)
    _owner_notifications(now, run, overdue=True)
    _policy_changes_waiting(now, run)
    return run


# --- the navigation's count badge ---------------------------------------------------------------


def waiting_count_for(user: Any, roles: set[str]) -> int:
    """Items waiting for this person: proposals a manager may decide, open items finance owns."""
    if not getattr(user, "is_authenticated", False):
        return 0
    count = 0
    if MANAGER_ROLE in roles:
        count += sum(manager_waiting_counts(user=user))
    if roles & {"finance", "accounts payable"}:
        count += Action.objects.filter(owner=user, status=ActionStatus.NEEDS_REVIEW).count()
        count += Remedy.objects.filter(owner=user, status__in=OPEN_REMEDY).count()
        count += Discrepancy.objects.filter(Q(owner=user) & Q(status__in=OPEN_DISCREPANCY)).count()
    return count


# --- the console's notifications: the bell and its list ------------------------------------------


def notifications_unread_count(user: Any) -> int:
    if not getattr(user, "is_authenticated", False):
        return 0
    return Notification.objects.filter(recipient=user, read_at__isnull=True).count()


def notification_mark_read(*, user: Any, pk: int, now: datetime | None = None) -> bool:
    """Mark one of this person's own notifications read; False if they have none with that id
    (someone else's is not theirs to mark, and is not news either)."""
    mine = Notification.objects.filter(pk=pk, recipient=user)
    if not mine.exists():
        return False
    # Read once: marking it again keeps the first time it was read.
    mine.filter(read_at__isnull=True).update(read_at=now or timezone.now())
    return True


def notifications_mark_all_read(*, user: Any, now: datetime | None = None) -> int:
    return Notification.objects.filter(recipient=user, read_at__isnull=True).update(read_at=now or timezone.now())
