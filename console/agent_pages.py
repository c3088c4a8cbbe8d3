"""The agent owner's page: one agent's tokens, recent proposals, webhook and delivery log.

Only the agent's owner sees it; anyone else (admins included) gets the same 404 as for an
agent that does not exist. Token issue, rotation and revocation post to the views in
console.account, which keep the security trail (one place for the token's rules); the webhook's URL and secret
changes are written to the same trail (actions.agents.webhooks).
"""

from __future__ import annotations

import functools

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from actions.agents.webhooks import (
    WebhookChangeRefused,
    WebhookInvalid,
    agent_recent_actions,
    webhook_deliveries_of,
    webhook_disable_by_owner,
    webhook_redeliver_by_owner,
    webhook_secret_rotate_by_owner,
    webhook_set_by_owner,
)
from actions.foundation.outbox import SIGNATURE_HEADER
from actions.models import Agent, AgentWebhook, AgentWebhookDelivery
from console.account import own_agent, secret_page, show_secret_once


class WebhookUrlForm(forms.Form):
    url = forms.CharField(max_length=2000, label="Webhook URL")


def _page(request: HttpRequest, agent: Agent, *, form: WebhookUrlForm | None = None, status: int = 200) -> HttpResponse:
    hook = AgentWebhook.objects.filter(agent=agent).first()
    context = {
        "agent": agent,
        "tokens": agent.tokens.all(),
        "hook": hook,
        "form": form or WebhookUrlForm(initial={"url": hook.url if hook else ""}),
        "actions": agent_recent_actions(agent),
        "deliveries": webhook_deliveries_of(agent),
        "signature_header": SIGNATURE_HEADER,
    }
    return render(request, "console/agent_page.html", context, status=status)


@require_safe
@login_required
def agent_page(request: HttpRequest, pk: int) -> HttpResponse:
    return _page(request, own_agent(request, pk))


SIGNING_KEY_PAGE = "console/webhook_secret.html"


@require_POST
@login_required
def agent_webhook_set(request: HttpRequest, pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    form = WebhookUrlForm(request.POST)
    if not form.is_valid():
        return _page(request, agent, form=form, status=400)
    try:
        issued = webhook_set_by_owner(agent=agent, user=request.user, url=form.cleaned_data["url"])
    except WebhookInvalid as invalid:
        form.add_error("url", str(invalid))
        return _page(request, agent, form=form, status=400)
    except WebhookChangeRefused as refused:
        messages.error(request, str(refused))
        return redirect("agent-page", pk=agent.pk)
    if issued is not None:
        return secret_page(request, SIGNING_KEY_PAGE, agent, issued.plain)
    messages.success(request, "The webhook URL is saved. The signing secret is unchanged.")
    return redirect("agent-page", pk=agent.pk)


@require_POST
@login_required
def agent_webhook_rotate(request: HttpRequest, pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    issue = functools.partial(webhook_secret_rotate_by_owner, agent=agent, user=request.user)
    refusals = (WebhookInvalid, WebhookChangeRefused)
    back = reverse("agent-page", args=[agent.pk])
    return show_secret_once(request, agent, issue, refusals=refusals, page=SIGNING_KEY_PAGE, back=back)


@require_POST
@login_required
def agent_webhook_disable(request: HttpRequest, pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    webhook_disable_by_owner(agent=agent, user=request.user)
    messages.success(request, "The webhook is switched off: no new events are sent. Setting a URL switches it on.")
    return redirect("agent-page", pk=agent.pk)


@require_POST
@login_required
def agent_webhook_redeliver(request: HttpRequest, pk: int, delivery_pk: int) -> HttpResponse:
    agent = own_agent(request, pk)
    delivery = AgentWebhookDelivery.objects.select_related("agent").filter(pk=delivery_pk, agent=agent).first()
    if delivery is None:
        raise Http404("No such delivery.")
    again = webhook_redeliver_by_owner(delivery=delivery, user=request.user)
    messages.success(request, f"Event {again.event_id} is queued to be sent again.")
    return redirect("agent-page", pk=agent.pk)
