"""Words for people: what the console's internal names and the receivers' errors mean to a clerk.

Internal names (``begin_submission``, ``system:dispatcher``, ``order_version``) and raw errors
(``AmbiguousError: Read timed out``) stay in the logs, the audit trail's data and the pages'
"Technical details" folds. Pages show the sentences below. One table per vocabulary, so a new
transition or binding that has no sentence yet falls back to a readable default instead of a
code word, and ``tests/actions/test_plain_language.py`` lists every known name.
"""

from __future__ import annotations

import re
from typing import Any

from actions.providers.money import from_minor_units

# --- the audit trail's transitions -------------------------------------------------------------

TRANSITIONS: dict[str, str] = {
    "propose": "Proposed",
    "approve": "Approved",
    "reject": "Rejected",
    "invalidate": "The approval no longer applied",
    "reopen": "Sent back for a new decision",
    "cancel": "Cancelled",
    "begin_submission": "Sent to the {receiver}",
    "retry": "Sent again to the {receiver}",
    "record_success": "Succeeded",
    "record_pending": "Accepted by the {receiver}; the final result comes later",
    "record_failure": "Failed",
    "record_not_sent": "Not sent: the {receiver} refused it before doing anything",
    "mark_unknown": "No clear answer from the {receiver}",
    "reconcile_found": "Outcome confirmed by checking with the {receiver}",
    "settle": "Final result received",
    "escalate": "Handed to finance to check",
    "resolve_succeeded": "Finance confirmed it succeeded",
    "resolve_failed": "Finance confirmed it failed",
    "resolve_retry": "Finance had it sent again",
    "assign_owner": "Assigned to a person in finance",
    "agent_owner_changed": "The proposing agent got a new owner",
    "auto_approval_held": "Left for a manager by the auto-approval policy",
}


def transition_words(transition: str, *, receiver: str = "payment provider") -> str:
    """What happened, for a clerk (``begin_submission`` -> "Sent to the payment provider")."""
    text = TRANSITIONS.get(transition)
    if text is None:
        return transition.replace("_", " ").capitalize()
    return text.format(receiver=receiver)


# --- who did it ------------------------------------------------------------------------------

SYSTEM_ACTORS: dict[str, str] = {
    "dispatcher": "the console (sending)",
    "reconciler": "the console (checking with the provider)",
    "lease-sweeper": "the console (tidying up an interrupted send)",
    "auto-approval": "the auto-approval policy",
}


def actor_words(label: str) -> str:
    """``system:dispatcher`` -> "the console (sending)"; ``agent:support-bot`` -> "agent support-bot"."""
    if label.startswith("system:"):
        name = label.removeprefix("system:")
        return SYSTEM_ACTORS.get(name, "the console")
    if label.startswith("agent:"):
        return "agent " + label.removeprefix("agent:")
    if label.startswith("policy:"):
        return "the auto-approval policy"
    return label


# --- why an approval no longer holds -------------------------------------------------------------

BINDINGS: dict[str, str] = {
    "order_version": (
        "The order changed after the approval (for example, another refund on it went ahead first), "
        "so the approval no longer applies. Nothing was sent; a manager needs to decide again."
    ),
    "bill_version": (
        "The bill changed after the approval, so the approval no longer applies. Nothing was sent; "
        "a manager needs to decide again."
    ),
    "bill_voided": "The bill was voided after the approval, so it cannot be adjusted. Nothing was sent.",
    "balance": "There is no longer enough money left on the order to refund this amount. Nothing was sent.",
    "expiry": "The approval expired before the console could use it. Nothing was sent.",
    "amount": "The amount changed after the approval. Nothing was sent.",
    "currency": "The currency changed after the approval. Nothing was sent.",
    "payload_hash": "The proposal's details changed after the approval. Nothing was sent.",
    "approval": "There was no approval to act on. Nothing was sent.",
}


def binding_words(binding: str) -> str:
    return BINDINGS.get(binding, "Something changed after the approval, so it no longer applies. Nothing was sent.")


# --- the receivers' errors -----------------------------------------------------------------------

# Checked in order; the first that matches the error's type, code or message gives the sentence.
_ERRORS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"timed? ?out|timeout|connection_error|connection (reset|refused|aborted)|read timed", re.I),
        "The {receiver} did not answer in time; we do not know yet whether the {effect} was made. "
        "The console checks with the {receiver} before doing anything else.",
    ),
    (
        re.compile(r"no such charge|charge_missing|resource_missing.*charge", re.I),
        "The {receiver} has no record of the customer's payment, so no {effect} can be made on it.",
    ),
    (
        re.compile(r"rate.?limit|too many requests", re.I),
        "The {receiver} asked the console to slow down. It will try again shortly.",
    ),
    (
        re.compile(r"idempotency|different parameters", re.I),
        "The {receiver} refused because an earlier request with the same reference had different details. "
        "Finance needs to look at it.",
    ),
    (
        re.compile(r"ConfigurationError|api key|unauthori[sz]ed|forbidden|permission", re.I),
        "The console could not sign in to the {receiver}. An administrator needs to check its settings; "
        "we do not know yet whether the {effect} was made.",
    ),
    (
        re.compile(r"NotFoundError|no such|not found|resource_missing", re.I),
        "The {receiver} has no record of it.",
    ),
    (
        re.compile(r"amount.*(exceed|greater)|exceeds", re.I),
        "The {receiver} refused: the amount is more than is left to refund on the payment.",
    ),
    (
        re.compile(r"server error|internal error|bad gateway|service unavailable|api_error|5\d\d", re.I),
        "The {receiver} had a problem on its side; we do not know yet whether the {effect} was made. "
        "The console checks again on its own.",
    ),
    (
        re.compile(r"AmbiguousError|MailAmbiguous|LookupFailed", re.I),
        "The {receiver}'s answer was unclear; we do not know yet whether the {effect} was made.",
    ),
    (
        re.compile(r"DefinitiveError|MailRejected|declined|refused|invalid", re.I),
        "The {receiver} refused it, and nothing was done.",
    ),
    (re.compile(r"MailNotSent", re.I), "The mail relay did not take the message; it was not sent."),
]


def error_words(error: Any, *, receiver: str = "payment provider", effect: str = "refund") -> str:
    """One sentence a clerk understands for a receiver's error: a dict as the attempts store it
    ({type, code, message, http_status}), an exception, or the raw text."""
    if not error:
        return ""
    if isinstance(error, dict):
        text = " ".join(str(error.get(key) or "") for key in ("type", "code", "message"))
    elif isinstance(error, BaseException):
        text = f"{type(error).__name__} {getattr(error, 'code', '') or ''} {error}"
    else:
        text = str(error)
    for pattern, sentence in _ERRORS:
        if pattern.search(text):
            return sentence.format(receiver=receiver, effect=effect)
    return f"Something went wrong with the {receiver}. The technical details below say what it answered."


# --- status codes stay out of messages -----------------------------------------------------------

_STATUS_CODE = re.compile(r"\s*\((?:HTTP |status )?[1-5]\d\d\)|\bHTTP [1-5]\d\d\b:?\s*|\bstatus [1-5]\d\d\b:?\s*")


def without_status_codes(text: str) -> str:
    """A message with any HTTP status code taken out ("Not done (409)." -> "Not done.")."""
    return _STATUS_CODE.sub("", text).strip()


# --- money and evidence ----------------------------------------------------------------------


def minor_to_text(amount_minor: Any, currency: str) -> str:
    """``4500, "eur"`` -> "45.00 EUR": a receiver's minor units, always with the currency; an
    amount whose currency is unknown says so rather than pretending."""
    if isinstance(amount_minor, bool) or not isinstance(amount_minor, int):
        return str(amount_minor)
    if not currency:
        return f"{amount_minor} (minor units, currency not recorded)"
    try:
        return f"{from_minor_units(amount_minor, currency)} {currency.upper()}"
    except ValueError:
        return f"{amount_minor} {currency}"


EVIDENCE_LABELS: dict[str, str] = {
    "metadata_action_id": "Action named by the provider's record",
    "amount_minor": "Amount",
    "console_status": "Status in the console",
    "effect_status": "Status at the provider",
    "recorded_reference": "Reference the console recorded",
    "effect_at_provider": "Reference found at the provider",
    "effects": "Records at the provider",
    "count": "How many",
    "send_again_decisions": "Decisions to send again",
    "expected": "Expected",
    "found": "Found at the provider",
    "found_by": "Found by",
}

_STATUS_WORDS = {"reconciliation": "checking with the provider"}


def evidence_rows(details: dict[str, Any], *, currency: str = "") -> list[tuple[str, str]]:
    """A discrepancy's evidence as (label, value) rows for a table: money with its currency,
    lists as comma-separated references, no raw dicts."""
    rows: list[tuple[str, str]] = []
    for key, value in details.items():
        label = EVIDENCE_LABELS.get(key, key.replace("_", " ").capitalize())
        if isinstance(value, dict) and "amount_minor" in value:
            text = minor_to_text(value.get("amount_minor"), str(value.get("currency") or currency))
        elif key == "amount_minor":
            text = minor_to_text(value, currency)
        elif isinstance(value, list):
            text = ", ".join(str(item) for item in value) or "none"
        elif value is None or value == "":
            text = "none"
        else:
            text = _STATUS_WORDS.get(str(value), str(value))
        rows.append((label, text))
    return rows


# --- a workflow's steps ------------------------------------------------------------------------

# A step's state as the plan page shows it: the child action's status, or PENDING before it
# exists. A status missing here falls back to its own label.
STEP_STATES: dict[str, str] = {
    "PENDING": "Not started",
    "PROPOSED": "Starting",
    "AUTHORIZED": "Starting",
    "SUBMITTING": "Being sent",
    "SETTLING": "Accepted; the final result comes later",
    "SUCCEEDED": "Done",
    "UNKNOWN": "No clear answer yet; being checked",
    "NEEDS_REVIEW": "With a person to check",
    "FAILED_FINAL": "Failed",
    "STALE": "Waiting for a new decision",
    "REJECTED": "Rejected",
    "CANCELLED": "Cancelled",
}


def step_words(name: str) -> str:
    """A template step's name as a heading: ``read_documents`` -> "Read documents"."""
    return name.replace("_", " ").strip().capitalize()


def step_state_words(state: str) -> str:
    return STEP_STATES.get(state, state.replace("_", " ").capitalize())


# --- an action, as a clerk names it ----------------------------------------------------------


def action_words(action: Any) -> str:
    """What a clerk knows an action by: "Refund · 45.00 EUR · Order 4909 · Adele Goldberg", or
    "Invoice adjustment · 20.00 EUR · Bill INV-2291 · Acme Supplies". Its id is a technical
    detail."""
    parts = [str(action.get_kind_display())]
    if action.currency:
        parts.append(f"{action.amount} {action.currency}")
    if action.order_id is not None:
        parts += [f"Order {action.order.number}", action.order.customer_name]
    elif action.bill_id is not None:
        parts += [f"Bill {action.bill.number}", action.bill.supplier_name]
    return " · ".join(part for part in parts if part)


# --- the engine's own phrases, where a page quotes them to clerks ------------------------------

# The kinds' explanations are written for the people who build kinds; the kinds page shows them
# to finance. These phrases are said in a clerk's words there; the longest first.
_CLERK_PHRASES: tuple[tuple[str, str], ...] = (
    ("(its payload hash differs: 409 naming the fields)", "(its contents differ; the agent is told which)"),
    ("through the payload hash", "through the proposal's exact contents"),
    ("payload hash", "the proposal's exact contents"),
)


def clerk_words(text: str) -> str:
    """``text`` with the engine's phrases ("payload hash", "409 naming the fields") in words."""
    for phrase, words in _CLERK_PHRASES:
        text = text.replace(phrase, words)
    return without_status_codes(text)
