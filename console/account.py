"""Every person's own page: password, second factor, and the agents they own.

- Password change: Django's own view, open to every signed-in person (staff or not).
- Second factor: one TOTP device per person (django-otp), set up by scanning a QR code and
  confirming a first code. Confirming a code later (``verify``) is the step-up that approving
  a high-value refund needs (approvals/step_up.py).
- Notifications: which e-mails the person receives (actions.notifications), saved on its own.
- Agents: the owner of an agent issues, rotates and revokes its tokens here. The token is shown
  once, on the answer to the POST that issued it, and never stored; issuing is written to the
  security trail. Admins cannot do this in the admin site (separation of duties).
"""

from __future__ import annotations

import functools
import time
from base64 import b32encode
from collections.abc import Callable
from typing import Any

import segno
from django import forms
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

from actions.agents.services import (
    AgentChangeRefused,
    TokenNotActive,
    agent_token_issue_by_owner,
    agent_token_revoke_by,
    agent_token_rotate_by_owner,
)
from actions.models import Agent, AgentToken, UserSettings
from approvals.step_up import STEP_UP_SESSION_KEY
from console.roles import MANAGER, user_roles
from console.timezones import time_zone_choices, user_time_zone_get, user_time_zone_set


class CodeForm(forms.Form):
    code = forms.RegexField(
        regex=r"^\s*[0-9]{6}\s*$",
        error_messages={"invalid": "Enter the 6-digit code your authenticator app shows."},
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "maxlength": "8"}),
    )


class TimeZoneForm(forms.Form):
    time_zone = forms.ChoiceField(
        choices=[],
        error_messages={"invalid_choice": "%(value)s is not a time zone name such as Europe/Berlin."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["time_zone"].widget.attrs.update({"id": "time-zone-select", "autocomplete": "off"})
        field = self.fields["time_zone"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = time_zone_groups()


# The regions of the IANA names people pick from; the rest (UTC, Etc/GMT+5, old aliases such as
# US/Eastern) go last under "Other", so the list opens on places rather than on abbreviations.
TIME_ZONE_REGIONS = (
    "Africa",
    "America",
    "Antarctica",
    "Arctic",
    "Asia",
    "Atlantic",
    "Australia",
    "Europe",
    "Indian",
    "Pacific",
)


def time_zone_groups() -> list[tuple[str, list[tuple[str, str]]]]:
    """The time zones grouped by region (an ``<optgroup>`` each), labelled by their place."""
    groups: dict[str, list[tuple[str, str]]] = {region: [] for region in (*TIME_ZONE_REGIONS, "Other")}
    for name in time_zone_choices():
        region, _, place = name.partition("/")
        if region in TIME_ZONE_REGIONS and place:
            groups[region].append((name, place.replace("_", " ").replace("/", " / ")))
        else:
            groups["Other"].append((name, name.replace("_", " ")))
    return [(region, names) for region, names in groups.items() if names]


class TokenLabelForm(forms.Form):
    label = forms.CharField(required=False, max_length=100)


def _device(user: Any, *, confirmed: bool) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=confirmed).order_by("-pk").first()


def _safe_next(request: HttpRequest, fallback: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=False):
        return target
    return fallback


@require_safe
@login_required
def account(request: HttpRequest) -> HttpResponse:
    return render(request, "console/account.html", account_context(request))


def account_context(request: HttpRequest) -> dict[str, Any]:
    agents = Agent.objects.filter(owner_id=request.user.pk).prefetch_related("tokens").order_by("name")
    return {
        "device": _device(request.user, confirmed=True),
        "agents": agents,
        "time_zone_form": TimeZoneForm(initial={"time_zone": user_time_zone_get(request)}),
        "notification_form": notification_form_for(request.user),
    }


@require_POST
@login_required
def time_zone_update(request: HttpRequest) -> HttpResponse:
    """The person's own time zone; a bad name is refused, nothing written, the page says why."""
    form = TimeZoneForm(request.POST)
    if not form.is_valid():
        context = {**account_context(request), "time_zone_form": form}
        return render(request, "console/account.html", context, status=400)
    name = form.cleaned_data["time_zone"]
    user_time_zone_set(request=request, name=name)
    messages.success(request, f"Times are now shown in {name.replace('_', ' ')}.")
    return redirect(f"{reverse('account')}#time-zone")


class PasswordChange(auth_views.PasswordChangeView):
    template_name = "console/password_change.html"
    success_url = reverse_lazy("account")

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        messages.success(self.request, "Your password is changed.")
        return response


@require_http_methods(["GET", "POST"])
@login_required
def two_factor_setup(request: HttpRequest) -> HttpResponse:
    if _device(request.user, confirmed=True) is not None:
        messages.info(request, "Your authenticator app is already set up.")
        return redirect("account")
    device = _device(request.user, confirmed=False)
    if device is None:
        device = TOTPDevice.objects.create(user=request.user, name="authenticator app", confirmed=False)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if device.verify_token(form.cleaned_data["code"].strip()):
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            otp_login(request, device)
            request.session[STEP_UP_SESSION_KEY] = time.time()
            messages.success(request, "Your authenticator app is set up.")
            return redirect("account")
        form.add_error("code", "That code is not right (or no longer current). Try the next one.")
    qr_svg = segno.make(device.config_url, error="m").svg_inline(scale=4, omitsize=True)
    context = {"form": form, "qr_svg": qr_svg, "secret": b32encode(device.bin_key).decode()}
    return render(request, "console/two_factor_setup.html", context)


@require_http_methods(["GET", "POST"])
@login_required
def two_factor_verify(request: HttpRequest) -> HttpResponse:
    """The step-up: confirm a current code; high-value approvals then work for a few minutes."""
    device = _device(request.user, confirmed=True)
    if device is None:
        messages.info(request, "Set up an authenticator app first.")
        return redirect("two-factor-setup")
    next_url = _safe_next(request, reverse("dashboard"))
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        # verify_token throttles repeated failures and refuses a code that was already used.
        if device.verify_token(form.cleaned_data["code"].strip()):
            otp_login(request, device)
            request.session[STEP_UP_SESSION_KEY] = time.time()
            messages.success(request, "Code confirmed. You can approve high-value refunds for the next few minutes.")
            return redirect(next_url)
        form.add_error("code", "That code is not right (or was already used). Wait for the next one.")
    return render(request, "console/two_factor_verify.html", {"form": form, "next": next_url})


# --- the owner page: tokens of one's own agents ------------------------------------------------


ISSUED_ONCE_PAGE = "console/token_issued.html"


def own_agent(request: HttpRequest, pk: int) -> Agent:
    """One of the person's own agents (the account page's tokens, the agent's own page)."""
    agent = Agent.objects.filter(pk=pk, owner_id=request.user.pk).first()
    if agent is None:
        # The same answer for someone else's agent and for none: an agent's existence is not news.
        raise Http404("You own no such agent.")
    return agent


def _own_token(request: HttpRequest, agent: Agent, token_pk: int) -> AgentToken:
    token = AgentToken.objects.select_related("agent").filter(pk=token_pk, agent=agent).first()
    if token is None:
        raise Http404("No such token.")
    return token


def secret_page(request: HttpRequest, template: str, agent: Agent, plain: str) -> HttpResponse:
    # Rendered as the POST's answer, never stored in the session or a message: reloading the
    # page or going back does not show it again.
    return render(request, template, {"agent": agent, "plain": plain})


def show_secret_once(
    request: HttpRequest,
    agent: Agent,
    issue: Callable[[], Any],
    *,
    refusals: tuple[type[Exception], ...],
    page: str,
    back: str = "",
) -> HttpResponse:
    """Issue a secret (an agent's token, its webhook's signing secret) and show it once on
    ``page``; a refusal is said on the page at the URL ``back`` (the account page unless given)."""
    try:
        issued = issue()
    except refusals as refused:
        messages.error(request, str(refused))
        return redirect(back or reverse("account"))
    return secret_page(request, page, agent, issued.plain)


@require_POST
@login_required
def agent_token_issue_view(request: HttpRequest, pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    form = TokenLabelForm(request.POST)
    label = form.cleaned_data["label"] if form.is_valid() else ""
    issue = functools.partial(agent_token_issue_by_owner, agent=agent, user=request.user, label=label)
    return show_secret_once(request, agent, issue, refusals=(AgentChangeRefused,), page=ISSUED_ONCE_PAGE)


@require_POST
@login_required
def agent_token_rotate_view(request: HttpRequest, pk: int, token_pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    token = _own_token(request, agent, token_pk)
    issue = functools.partial(agent_token_rotate_by_owner, token=token, user=request.user)
    return show_secret_once(request, agent, issue, refusals=(AgentChangeRefused, TokenNotActive), page=ISSUED_ONCE_PAGE)


@require_POST
@login_required
def agent_token_revoke_view(request: HttpRequest, pk: int, token_pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    token = _own_token(request, agent, token_pk)
    agent_token_revoke_by(token=token, user=request.user)
    messages.success(request, f"Token {token.prefix}… is revoked; it stops working at once.")
    # Back to the page the owner came from (the account page or the agent's own page).
    return redirect(_safe_next(request, reverse("account")))


# --- notifications: each person's choice, a section of the account page -----------------------
# Saved on its own (only these four columns), so that it never overwrites the other settings
# kept on the same row, such as the time zone.

NOTIFICATION_FIELDS = ["notify_waiting_proposals", "waiting_minutes", "notify_escalations", "notify_overdue"]


class NotificationSettingsForm(forms.ModelForm):  # type: ignore[type-arg]
    waiting_minutes = forms.IntegerField(
        min_value=1,
        max_value=7 * 24 * 60,
        label="Minutes a proposal may wait before I am told",
        error_messages={
            "min_value": "Enter at least 1 minute.",
            "max_value": "Enter at most 10080 minutes (a week).",
            "invalid": "Enter a whole number of minutes.",
        },
    )

    class Meta:
        model = UserSettings
        fields = NOTIFICATION_FIELDS
        labels = {
            "notify_waiting_proposals": "Proposals waiting for a manager",
            "notify_escalations": "Items escalated to me",
            "notify_overdue": "Items I own that are overdue",
        }


# Only managers decide proposals: nobody else is offered (or can save) the choices about them.
MANAGER_ONLY_FIELDS = ("notify_waiting_proposals", "waiting_minutes")


def _notification_fields(user: Any) -> list[str]:
    if MANAGER in user_roles(user):
        return NOTIFICATION_FIELDS
    return [name for name in NOTIFICATION_FIELDS if name not in MANAGER_ONLY_FIELDS]


def _notification_form(user: Any, data: Any = None, *, instance: UserSettings) -> NotificationSettingsForm:
    form = NotificationSettingsForm(data, instance=instance)
    for name in MANAGER_ONLY_FIELDS:
        if name not in _notification_fields(user):
            del form.fields[name]
    return form


def notification_form_for(user: Any) -> NotificationSettingsForm:
    found = UserSettings.objects.filter(user=user).first() or UserSettings(user=user)
    return _notification_form(user, instance=found)


@require_POST
@login_required
def notification_settings_save(request: HttpRequest) -> HttpResponse:
    instance = UserSettings.for_user(request.user)  # type: ignore[arg-type]
    form = _notification_form(request.user, request.POST, instance=instance)
    if not form.is_valid():
        # The account page again, with the reasons next to the fields; nothing was saved.
        context = {**account_context(request), "notification_form": form}
        return render(request, "console/account.html", context, status=400)
    saved = form.save(commit=False)
    saved.save(update_fields=_notification_fields(request.user))
    messages.success(request, "Your notification choices are saved.")
    return redirect("account")
