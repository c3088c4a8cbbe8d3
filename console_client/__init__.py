"""A typed Python client for the effect console's agent API (docs/agents/python-client.md).

It needs only ``requests``, not Django: copy the folder into an agent's project, or put this
repository on its path.

    from console_client import ConsoleClient

    with ConsoleClient("http://127.0.0.1:8000", token) as console:
        action = console.propose_refund(order_number="4821", request_number=1, amount="12.50",
                                        currency="EUR", reason_code="damaged", evidence="...")
        action = console.wait_for_outcome(action.action_id, timeout=600)
"""

from __future__ import annotations

from console_client.client import ConsoleClient, RetryPolicy
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

__all__ = [
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
