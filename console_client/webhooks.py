"""Checking the signature of a webhook event from the console (docs/agents/webhooks.md).

The console signs each event like Stripe does: the ``Console-Signature`` header is
``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" with the secret>``. Check it over the
raw bytes received (before parsing the JSON), and refuse old timestamps so that a recorded
request cannot be replayed later.

    from console_client.webhooks import verify_signature, SignatureInvalid

    try:
        event = verify_signature(body, request.headers["Console-Signature"], secret)
    except SignatureInvalid:
        return 400
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

SIGNATURE_HEADER = "Console-Signature"
DEFAULT_TOLERANCE_SECONDS = 300


class SignatureInvalid(ValueError):
    """The event was not signed with this secret, or was signed too long ago."""


def verify_signature(
    body: bytes,
    header: str,
    secret: str,
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """Return the event (the parsed body) if ``header`` is a valid signature of ``body``."""
    timestamp = ""
    candidates: list[str] = []
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            timestamp = value
        elif key == "v1":
            candidates.append(value)
    if not timestamp.isdigit() or not candidates:
        raise SignatureInvalid("The signature header has no t=... and v1=... parts.")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance:
        raise SignatureInvalid(f"The signature's timestamp is more than {tolerance} s away from now.")
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    # compare_digest: the time taken does not tell how many characters matched.
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise SignatureInvalid("No v1 signature matches this secret.")
    parsed: dict[str, Any] = json.loads(body)
    return parsed
