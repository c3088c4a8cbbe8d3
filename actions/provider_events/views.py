"""``POST /webhooks/stripe``: the payment provider's events, verified by their signature."""

from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from actions.provider_events.services import WebhookRefused, webhook_receive

logger = logging.getLogger(__name__)


# The provider cannot hold a CSRF token; the signature over the raw body is the
# authentication, checked before anything is read.
@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    try:
        result = webhook_receive(payload=request.body, signature=request.headers.get("Stripe-Signature", ""))
    except WebhookRefused as refused:
        logger.warning("webhook refused: %s", refused)
        return JsonResponse({"error": str(refused)}, status=400)
    # 200 for a replay too: the provider retries until it gets a 2xx, and the event is stored.
    return JsonResponse({"id": result.event_id, "replay": result.replay, "outcome": result.outcome})
