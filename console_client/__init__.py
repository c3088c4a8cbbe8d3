"""A typed Python client for the effect console's agent API (docs/agents/python-client.md).

It needs only ``requests``, not Django. Install it as a package (``pip install ./console_client``
from a checkout, or the wheel ``python -m pip wheel --no-deps ./console_client`` builds): its
version, 1.0.0, speaks API version 2026-12-01 (``API_VERSION``), which it names in the
``Console-Version`` header of every request, so that the console answers it the way it was
written for, whatever the token's own version (docs/api-versions.md).

    from console_client import ConsoleClient

    with ConsoleClient("http://127.0.0.1:8000", token) as console:
        action = console.propose_refund(order_number="4821", request_number=1, amount="12.50",
                                        currency="EUR", reason_code="damaged", evidence="...")
        action = console.wait_for_outcome(action.action_id, timeout=600)
"""

from __future__ import annotations

from console_client.client import API_VERSION, ConsoleClient, RetryPolicy
from console_client.errors import (
    BadInput,
    Conflict,
    ConsoleError,
    ErrorKind,
    FieldError,
    NotAllowed,
    NotFound,
    OutcomeTimeout,
    Unavailable,
)
from console_client.models import FINAL_STATUSES, Action, ActionPage, Explanation, RefundRequest

__version__ = "1.0.0"

__all__ = [
    "API_VERSION",
    "FINAL_STATUSES",
    "Action",
    "ActionPage",
    "BadInput",
    "Conflict",
    "ConsoleClient",
    "ConsoleError",
    "ErrorKind",
    "Explanation",
    "FieldError",
    "NotAllowed",
    "NotFound",
    "OutcomeTimeout",
    "RefundRequest",
    "RetryPolicy",
    "Unavailable",
]
