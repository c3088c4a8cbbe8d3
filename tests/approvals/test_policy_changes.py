"""Changes to approval limits and auto-approval caps are policy changes: the admin site proposes
them, and they take effect only when a second person, a member of finance, confirms them.

Everything goes through the pages as a browser would: the admin site's forms for the proposal,
finance's page for the decision. The security trail holds every step with before and after.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.test import Client

from actions.models import SecurityEvent, SecurityEventKind
from actions.notifications import notifications_send_due
from approvals.models import ApprovalLimit, AutoApprovalCap, CapScope, PolicyChange, PolicyChangeStatus
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PAGE = "/approvals/policy-changes/"


@pytest.fixture(autouse=True)
def outbox(settings: Any) -> list[Any]:
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CONSOLE_BASE_URL = "https://console.example.com/"
    mail.outbox = []
    return mail.outbox


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def limit_of(user: Any, currency: str = "EUR") -> Decimal:
    return ApprovalLimit.objects.get(user=user, currency=currency).max_amount


def propose_limit(admin: Any, manager: Any, amount: str = "750", *, follow: bool = False) -> Any:
    limit = ApprovalLimit.objects.get(user=manager, currency="EUR")
    return logged_in(admin).post(
        f"/admin/approvals/approvallimit/{limit.pk}/change/", {"max_amount": amount}, follow=follow
    )


def confirm(user: Any, change: PolicyChange) -> Any:
    return logged_in(user).post(f"{PAGE}{change.pk}/confirm")


def trail(kind: str) -> list[SecurityEvent]:
    return list(SecurityEvent.objects.filter(kind=kind).order_by("pk"))


# --- the admin proposes --------------------------------------------------------------------------


def test_an_admins_edit_of_a_limit_leaves_it_unchanged_until_finance_confirms(
    console_admin: Any, manager: Any
) -> None:
    response = propose_limit(console_admin, manager, "750")

    assert response.status_code == 302
    assert limit_of(manager) == Decimal("500.00")
    change = PolicyChange.objects.get()
    assert change.status == PolicyChangeStatus.PENDING
    assert change.what() == f"approval limit of {manager.username} in EUR"
    assert (change.before, change.after) == ({"max_amount": "500.00"}, {"max_amount": "750.00"})
    assert change.proposed_by == console_admin
    [proposed] = trail(SecurityEventKind.POLICY_CHANGE_PROPOSED)
    assert proposed.actor == console_admin
    assert proposed.detail["before"] == {"max_amount": "500.00"}
    assert proposed.detail["after"] == {"max_amount": "750.00"}
    # The admin is told where it stands.
    page = logged_in(console_admin).get("/admin/approvals/approvallimit/").content.decode()
    assert "Waiting for finance" in page and "500.00 EUR to 750.00 EUR" in page


def test_a_new_limit_and_a_removal_wait_for_finance_too(console_admin: Any, manager: Any, finance: Any) -> None:
    newcomer = make_user("nina.manager", "manager")
    client = logged_in(console_admin)

    added = client.post(
        "/admin/approvals/approvallimit/add/", {"user": newcomer.pk, "currency": "EUR", "max_amount": "80"}
    )
    usd = ApprovalLimit.objects.get(user=manager, currency="USD")
    removed = client.post(f"/admin/approvals/approvallimit/{usd.pk}/delete/", {"post": "yes"})

    assert added.status_code == 302 and removed.status_code == 302
    assert not ApprovalLimit.objects.filter(user=newcomer).exists()
    assert ApprovalLimit.objects.filter(pk=usd.pk).exists()
    adding, removing = PolicyChange.objects.order_by("pk")
    assert (adding.operation, adding.before, adding.after) == ("create", None, {"max_amount": "80.00"})
    assert (removing.operation, removing.before, removing.after) == ("delete", {"max_amount": "500.00"}, None)

    assert confirm(finance, adding).status_code == 302
    assert confirm(finance, removing).status_code == 302
    assert limit_of(newcomer) == Decimal("80.00")
    assert not ApprovalLimit.objects.filter(pk=usd.pk).exists()


def test_a_second_change_to_the_same_limit_waits_for_the_first_to_be_decided(
    console_admin: Any, manager: Any
) -> None:
    other_admin = make_user("alex.admin", "admin", is_staff=True)
    propose_limit(console_admin, manager, "750")

    response = propose_limit(other_admin, manager, "9000", follow=True)

    assert response.redirect_chain == [("/admin/approvals/approvallimit/", 302)]
    assert PolicyChange.objects.count() == 1
    assert PolicyChange.objects.get().after == {"max_amount": "750.00"}
    assert "already waiting for finance" in response.content.decode()


def test_saving_the_values_in_force_proposes_nothing(console_admin: Any, manager: Any) -> None:
    propose_limit(console_admin, manager, "500.00")
    assert not PolicyChange.objects.exists()
    assert not trail(SecurityEventKind.POLICY_CHANGE_PROPOSED)


# --- finance is told -----------------------------------------------------------------------------


def test_finance_is_told_of_a_waiting_change_once_with_a_link_to_confirm_it(
    console_admin: Any, manager: Any, finance: Any, outbox: list[Any]
) -> None:
    make_user("alice.payable", "accounts payable")
    propose_limit(console_admin, manager, "750")

    notifications_send_due()
    notifications_send_due()

    [message] = outbox
    assert message.to == [finance.email]
    assert f"approval limit of {manager.username} in EUR: 500.00 EUR to 750.00 EUR" in message.body
    assert "proposed by adam.admin" in message.body
    assert "https://console.example.com/approvals/policy-changes/" in message.body


def test_a_member_of_finance_is_not_asked_to_confirm_their_own_proposal(
    manager: Any, finance: Any, outbox: list[Any]
) -> None:
    admin_in_finance = make_user("ada.admin", "admin", "finance", is_staff=True)
    propose_limit(admin_in_finance, manager, "750")

    notifications_send_due()

    assert [message.to for message in outbox] == [[finance.email]]


# --- finance decides -----------------------------------------------------------------------------


def test_a_finance_clerk_confirms_and_the_new_limit_applies_with_before_and_after_in_the_trail(
    console_admin: Any, manager: Any, finance: Any
) -> None:
    propose_limit(console_admin, manager, "750")
    change = PolicyChange.objects.get()

    page = logged_in(finance).get(PAGE)
    response = confirm(finance, change)

    assert page.status_code == 200
    assert "500.00 EUR" in page.content.decode() and "750.00 EUR" in page.content.decode()
    assert response.status_code == 302
    assert limit_of(manager) == Decimal("750.00")
    change.refresh_from_db()
    assert (change.status, change.decided_by) == (PolicyChangeStatus.CONFIRMED, finance)
    [confirmed] = trail(SecurityEventKind.POLICY_CHANGE_CONFIRMED)
    assert confirmed.actor == finance
    assert confirmed.subject == f"approval limit of {manager.username} in EUR"
    assert confirmed.detail["before"] == {"max_amount": "500.00"}
    assert confirmed.detail["after"] == {"max_amount": "750.00"}
    assert confirmed.detail["proposed_by"] == console_admin.username
    # Decided once: a second confirmation is refused and changes nothing.
    again = confirm(make_user("finn.finance", "finance"), change)
    assert again.status_code == 409
    assert len(trail(SecurityEventKind.POLICY_CHANGE_CONFIRMED)) == 1


def test_the_proposer_cannot_confirm_their_own_change_even_as_a_member_of_finance(
    manager: Any, finance: Any
) -> None:
    admin_in_finance = make_user("ada.admin", "admin", "finance", is_staff=True)
    propose_limit(admin_in_finance, manager, "750")
    change = PolicyChange.objects.get()

    response = confirm(admin_in_finance, change)

    assert response.status_code == 403
    assert "another member of finance must confirm it" in response.content.decode()
    assert limit_of(manager) == Decimal("500.00")
    change.refresh_from_db()
    assert change.status == PolicyChangeStatus.PENDING
    assert not trail(SecurityEventKind.POLICY_CHANGE_CONFIRMED)
    # Someone else in finance may.
    assert confirm(finance, change).status_code == 302
    assert limit_of(manager) == Decimal("750.00")


def test_a_member_of_finance_cannot_confirm_a_raise_of_their_own_limit(console_admin: Any) -> None:
    finance_manager = make_user("fred.finance", "finance", "manager", limits={"EUR": "100"})
    propose_limit(console_admin, finance_manager, "100000")

    response = confirm(finance_manager, PolicyChange.objects.get())

    assert response.status_code == 403
    assert limit_of(finance_manager) == Decimal("100.00")


@pytest.mark.parametrize("role", ["admin", "manager", "accounts payable", "superuser"])
def test_only_finance_may_see_or_decide_policy_changes(console_admin: Any, manager: Any, role: str) -> None:
    propose_limit(console_admin, manager, "750")
    change = PolicyChange.objects.get()
    if role == "superuser":
        outsider = make_user("sam.super", is_staff=True, is_superuser=True)
    else:
        outsider = make_user("oscar.outsider", role)
    client = logged_in(outsider)

    assert client.get(PAGE).status_code == 403
    assert client.post(f"{PAGE}{change.pk}/confirm").status_code == 403
    assert client.post(f"{PAGE}{change.pk}/reject").status_code == 403
    assert limit_of(manager) == Decimal("500.00")
    change.refresh_from_db()
    assert change.status == PolicyChangeStatus.PENDING


def test_the_pages_ask_for_a_login_and_a_post(finance: Any, console_admin: Any, manager: Any) -> None:
    propose_limit(console_admin, manager, "750")
    change = PolicyChange.objects.get()

    assert Client().get(PAGE).status_code == 302
    assert Client().post(f"{PAGE}{change.pk}/confirm").status_code == 302
    assert logged_in(finance).get(f"{PAGE}{change.pk}/confirm").status_code == 405
    assert logged_in(finance).post(f"{PAGE}999999/confirm").status_code == 404
    assert limit_of(manager) == Decimal("500.00")


def test_confirming_takes_a_csrf_token(finance: Any, console_admin: Any, manager: Any) -> None:
    propose_limit(console_admin, manager, "750")
    client = Client(enforce_csrf_checks=True)
    client.force_login(finance)

    response = client.post(f"{PAGE}{PolicyChange.objects.get().pk}/confirm")

    assert response.status_code == 403
    assert limit_of(manager) == Decimal("500.00")


def test_a_rejection_leaves_the_limit_as_it_was_and_is_in_the_trail(
    console_admin: Any, manager: Any, finance: Any
) -> None:
    propose_limit(console_admin, manager, "750")
    change = PolicyChange.objects.get()

    response = logged_in(finance).post(f"{PAGE}{change.pk}/reject", {"note": "No ticket asks for this."})

    assert response.status_code == 302
    assert limit_of(manager) == Decimal("500.00")
    change.refresh_from_db()
    assert (change.status, change.decided_by) == (PolicyChangeStatus.REJECTED, finance)
    [rejected] = trail(SecurityEventKind.POLICY_CHANGE_REJECTED)
    assert rejected.detail["before"] == {"max_amount": "500.00"}
    assert rejected.detail["after"] == {"max_amount": "750.00"}
    assert rejected.detail["note"] == "No ticket asks for this."
    assert confirm(make_user("finn.finance", "finance"), change).status_code == 409
    assert limit_of(manager) == Decimal("500.00")
    # Once decided, the row is free for a new proposal.
    assert propose_limit(console_admin, manager, "600").status_code == 302
    assert PolicyChange.objects.filter(status=PolicyChangeStatus.PENDING).count() == 1


def test_a_change_whose_limit_moved_since_is_refused_and_writes_nothing(
    console_admin: Any, manager: Any, finance: Any
) -> None:
    propose_limit(console_admin, manager, "750")
    ApprovalLimit.objects.filter(user=manager, currency="EUR").update(max_amount=Decimal("20"))

    response = confirm(finance, PolicyChange.objects.get())

    assert response.status_code == 409
    assert "changed since this was proposed" in response.content.decode()
    assert limit_of(manager) == Decimal("20.00")
    assert PolicyChange.objects.get().status == PolicyChangeStatus.PENDING


def test_finance_finds_the_page_from_the_home_page(console_admin: Any, manager: Any, finance: Any) -> None:
    propose_limit(console_admin, manager, "750")

    home = logged_in(finance).get("/").content.decode()
    admins_home = logged_in(console_admin).get("/").content.decode()

    assert 'data-testid="policy-changes"' in home and PAGE in home
    assert "1</strong> change to approval limits or auto-approval caps waits" in home
    assert PAGE not in admins_home


# --- caps ----------------------------------------------------------------------------------------


def test_a_cap_is_added_changed_and_removed_only_through_finance(console_admin: Any, finance: Any) -> None:
    client = logged_in(console_admin)
    fields = {"max_amount": "5.00", "max_count": "1", "window_hours": "24"}

    client.post("/admin/approvals/autoapprovalcap/add/", {"scope": "target", "currency": "EUR", **fields})
    assert not AutoApprovalCap.objects.exists()
    confirm(finance, PolicyChange.objects.get(status=PolicyChangeStatus.PENDING))
    cap = AutoApprovalCap.objects.get()
    assert (cap.scope, cap.max_amount, cap.max_count) == (CapScope.TARGET, Decimal("5.00"), 1)

    client.post(f"/admin/approvals/autoapprovalcap/{cap.pk}/change/", {**fields, "max_amount": "5000.00"})
    cap.refresh_from_db()
    assert cap.max_amount == Decimal("5.00")
    raise_ = PolicyChange.objects.get(status=PolicyChangeStatus.PENDING)
    assert raise_.before == {"max_amount": "5.00", "max_count": 1, "window_hours": 24}
    assert raise_.after == {"max_amount": "5000.00", "max_count": 1, "window_hours": 24}
    confirm(finance, raise_)
    cap.refresh_from_db()
    assert cap.max_amount == Decimal("5000.00")

    client.post(f"/admin/approvals/autoapprovalcap/{cap.pk}/delete/", {"post": "yes"})
    assert AutoApprovalCap.objects.filter(pk=cap.pk).exists()
    confirm(finance, PolicyChange.objects.get(status=PolicyChangeStatus.PENDING))
    assert not AutoApprovalCap.objects.exists()
    [confirmed_raise] = [
        e for e in trail(SecurityEventKind.POLICY_CHANGE_CONFIRMED) if e.detail["operation"] == "update"
    ]
    assert confirmed_raise.detail["before"]["max_amount"] == "5.00"
    assert confirmed_raise.detail["after"]["max_amount"] == "5000.00"
    assert len(trail(SecurityEventKind.POLICY_CHANGE_CONFIRMED)) == 3
