"""The supplier-email kind's contract with the engine: telling a supplier about a change, by email.

Email is the hardest receiver there is: SMTP has no idempotency key, nobody can ask the
supplier's mailbox whether a message arrived, and a message cannot be taken back. The contract
says so (no keys, no lookup, irreversible), and the engine draws the consequences from it: an
ambiguous send goes to a named person in finance at once and is never re-sent automatically
(invariant 16). Only a person's recorded "send again" sends it a second time, and that message
says it may be a repeat.

The target is the supplier, named in the material payload by its code (it moves no money, so
there is no balance to reserve and no foreign key to carry): an approval binds the supplier's
version, which changes with its contacts, and the claim checks again that the address is still
one of its known contacts.

The subject and body are rendered from a versioned template when the agent proposes and stored
in the payload: the message that is sent is the payload's text, byte for byte, under a
Message-ID derived from the action id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.utils import timezone

from actions.foundation.trail import resend_decisions
from actions.kinds.base import (
    Answer,
    BindingFailure,
    Effect,
    EffectKind,
    Explanations,
    LedgerUnavailable,
    LedgerWindow,
    Lookup,
    LookupVerdict,
    Outcome,
    ReceiverContract,
    StepClass,
)
from actions.models import Action, ActionKind, Supplier
from actions.providers.mail.smtp import (
    Accepted,
    MailAmbiguous,
    MailError,
    MailNotSent,
    MailRejected,
    OutgoingEmail,
    SmtpMailer,
)

ACTION_ID_HEADER = "X-Console-Action-Id"
REPEAT_HEADER = "X-Console-Possible-Repeat"

CONTRACT = ReceiverContract(
    receiver="mail relay",
    honours_keys=False,
    key_retention=None,
    supports_lookup=False,
    lookup_authoritative=False,
    lookup_visibility_delay=timedelta(0),
    can_settle_later=False,
    step_class=StepClass.IRREVERSIBLE,
    correction_path="A person explains to the supplier: a message cannot be taken back.",
)


# --- identity -----------------------------------------------------------------------------


def supplier_email_action_id(*, supplier: str, reference: str, template: str) -> str:
    """The business action: this template's message to this supplier about this reference."""
    return f"{ActionKind.SUPPLIER_EMAIL}:{supplier}:{reference}:{template}"


def message_reference(action_id: str) -> str:
    """The message's own name, derived from the action id alone: the same for every attempt."""
    return "email-" + hashlib.sha256(action_id.encode()).hexdigest()[:32]


def message_id_for(action_id: str, *, domain: str) -> str:
    return f"<{message_reference(action_id)}@{domain}>"


def reference_of_message_id(message_id: str) -> str:
    return message_id.strip().strip("<>").partition("@")[0]


# --- the answer table ---------------------------------------------------------------------
#
# | relay's answer                                              | outcome                      |
# |-------------------------------------------------------------|------------------------------|
# | 250 to the message                                          | SUCCEEDED                    |
# | 4xx before DATA's content, or no connection at all          | NOT_SENT: sent again later   |
# | 5xx at any point                                            | FAILED_FINAL                 |
# | connection lost or timeout after the content, 4xx after it  | UNKNOWN: a person, at once   |
# | a backend that cannot say when it failed                    | UNKNOWN: a person, at once   |


def answer_from_mail_error(error: MailError) -> Answer:
    if isinstance(error, MailNotSent):
        return Answer(outcome=Outcome.NOT_SENT, error=error)
    if isinstance(error, MailRejected):
        return Answer(outcome=Outcome.FAILED_FINAL, error=error)
    # MailAmbiguous and anything this table does not know: the message may have left.
    return Answer(outcome=Outcome.UNKNOWN, error=error)


def effect_from_accepted(action: Action, accepted: Accepted) -> Effect:
    return Effect(
        reference=message_reference(action.action_id),
        status="accepted",
        outcome=Outcome.SUCCEEDED,
        amount_minor=None,
        currency="",
        action_id=action.action_id,
        raw={"message_id": accepted.message_id, "reply": accepted.reply},
    )


def effect_from_ledger_row(row: dict[str, Any]) -> Effect:
    return Effect(
        reference=reference_of_message_id(str(row.get("message_id", ""))),
        status="accepted",
        outcome=Outcome.SUCCEEDED,
        amount_minor=None,
        currency="",
        action_id=str(row.get("action_id") or "") or None,
        raw={k: row.get(k) for k in ("id", "message_id", "action_id", "rcpt_to", "subject", "possible_repeat")},
        created=received_at(row),
    )


def received_at(row: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(row["received_at"]))
    except (KeyError, ValueError):
        return None


# --- what is sent -------------------------------------------------------------------------


def outgoing_email(action: Action) -> OutgoingEmail:
    """The message for the action, from the payload's text; marked when a person chose to send again."""
    payload = action.payload
    headers = {ACTION_ID_HEADER: action.action_id}
    body = str(payload["body"])
    decisions = resend_decisions(action)
    if decisions:
        first = action.first_attempt_at or decisions[0].created_at
        when = f"{timezone.localtime(first):%Y-%m-%d %H:%M %Z}"
        headers[REPEAT_HEADER] = f"yes; send-again decision {len(decisions)}; first attempt {when}"
        body = (
            f"[Possible repeat: this message may already have reached you on {when}. "
            "If you have it, please disregard this copy.]\n\n" + body
        )
    return OutgoingEmail(
        message_id=str(payload["message_id"]),
        from_email=str(payload["from"]),
        to=str(payload["to"]),
        subject=str(payload["subject"]),
        body=body,
        headers=headers,
    )


class MailRelay:
    """The relay behind the engine's words: send only. It cannot be asked, and it has no keys."""

    contract = CONTRACT

    def __init__(self, mailer: SmtpMailer, ledger_url: str) -> None:
        self.mailer = mailer
        self.ledger_url = ledger_url

    def send(self, action: Action) -> Answer:
        try:
            accepted = self.mailer.send(outgoing_email(action))
        except MailError as error:
            return answer_from_mail_error(error)
        except Exception as error:
            return answer_from_mail_error(MailAmbiguous(f"{type(error).__name__}: {error}", content_sent=None))
        return effect_from_accepted(action, accepted).answer()

    def lookup(self, action: Action) -> Lookup:
        return Lookup(LookupVerdict.INCONCLUSIVE, error=MailAmbiguous("A mailbox cannot be asked."))

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        """The mail sandbox's list of accepted messages. A real relay has none: then nothing.
        The list has no filter, so a window is cut here, from each message's receipt time."""
        if not self.ledger_url:
            return iter(())
        try:
            response = requests.get(f"{self.ledger_url.rstrip('/')}/messages", timeout=10)
            response.raise_for_status()
            rows = response.json()["messages"]
        except (requests.RequestException, ValueError, KeyError) as error:
            raise LedgerUnavailable(f"the mail sandbox's list could not be read: {error}") from error
        # In the demo the console's notifications to its own people go through the same sandbox
        # (actions/notifications.py); they are not supplier emails, and are not effects to audit.
        ours = settings.NOTIFICATION_EMAIL_FROM
        effects = (effect_from_ledger_row(row) for row in rows if row.get("mail_from") != ours)
        return iter(
            [e for e in effects if window is None or e.created is None or window.holds(e.created)]
        )


# --- the kind -----------------------------------------------------------------------------


class SupplierEmailKind(EffectKind):
    name = ActionKind.SUPPLIER_EMAIL.value
    label = "Supplier email"
    # Accounts payable is part of finance, and finance already works the review queue: an
    # ambiguous email is one more item there, with a named owner and a due time.
    owner_group = "finance"
    explanations = Explanations(
        noun="message",
        succeeded="The mail relay accepted the message (250).",
        pending="The mail relay is taking the message.",
        failed="The mail relay refused the message for good",
        on_failure="Nothing was sent; the supplier has not been told. A person decides whether to write by hand.",
    )
    id_pattern = "supplier_email:<supplier code>:<business reference>:<template>"
    example_action_id = "supplier_email:ACME:bill-1042:bill_adjusted"
    binds = "the supplier's version (its contacts), the rendered message's hash and expiry"
    moves_money = False
    answer_table = (
        ("250: the relay took the message", "Succeeded, recorded under its Message-ID.", True),
        ("4xx before DATA: nothing was handed over", "Sent again later under the same approval: not a repeat.", True),
        ("5xx: refused for good", "Failed for good; nothing is resent.", True),
        (
            "Connection lost or timeout after DATA",
            "Needs review at once, owned by a named member of finance with a due time; never resent automatically.",
            False,
        ),
    )
    resolutions = ("succeeded", "resend", "failed")
    confirmation_needs_evidence = True
    resolution_labels = {
        "succeeded": "Confirm delivered",
        "retry": "Retry with the same key",
        "failed": "Abandon",
        "resend": "Send again",
    }

    def receiver(self) -> MailRelay:
        return MailRelay(SmtpMailer(timeout_seconds=settings.EMAIL_TIMEOUT), settings.MAIL_SANDBOX_URL)

    def contract(self) -> ReceiverContract:
        return CONTRACT

    def request_body(self, action: Action) -> dict[str, Any]:
        email = outgoing_email(action)
        return {
            "message_id": email.message_id,
            "headers": email.headers,
            "from": email.from_email,
            "to": email.to,
            "subject": email.subject,
            "body": email.body,
            "template": action.payload.get("template"),
            "template_version": action.payload.get("template_version"),
        }

    def lookup_request(self, action: Action) -> dict[str, Any]:
        return {"message_id": action.payload.get("message_id"), "action_id": action.action_id}

    def target_label(self, action: Action) -> str:
        return f"supplier {action.payload.get('supplier', '-')} ({action.payload.get('to', '-')})"

    def message_preview(self, action: Action) -> dict[str, str] | None:
        payload = action.payload
        return {
            name: str(payload.get(name, ""))
            for name in ("to", "from", "subject", "body", "message_id", "template", "template_version")
        }

    def default_reference(self, action: Action) -> str:
        return message_reference(action.action_id)

    # --- binding: the supplier's contacts -------------------------------------------------

    def _supplier(self, action: Action) -> Supplier | None:
        return Supplier.objects.filter(code=action.payload.get("supplier")).first()

    def target_version(self, action: Action) -> int | None:
        supplier = self._supplier(action)
        return supplier.version if supplier is not None else None

    def target_changed_words(self, action: Action, *, shown_version: int | None) -> str:
        return f"The contacts of supplier {action.payload.get('supplier', '-')} changed since you opened this page."

    def _contact_problem(self, action: Action) -> str | None:
        supplier = self._supplier(action)
        if supplier is None:
            return f"There is no supplier {action.payload.get('supplier')} any more."
        if str(action.payload.get("to", "")).lower() not in supplier.known_addresses():
            return f"{action.payload.get('to')} is no longer one of {supplier.code}'s known contacts."
        return None

    def approval_refusal(self, action: Action) -> tuple[str, str] | None:
        problem = self._contact_problem(action)
        return ("unknown_contact", problem) if problem else None

    def auto_approval_refusal(self, action: Action) -> str | None:
        return "a person reads every message to a supplier before it goes"

    def reserve(self, action: Action, *, approved_version: int | None) -> list[BindingFailure]:
        """Nothing to reserve; the claim checks that the approval still matches the supplier's
        contacts (its version) and that the address is still one of them."""
        supplier = Supplier.objects.select_for_update().filter(code=action.payload.get("supplier")).first()
        if supplier is None:
            return [BindingFailure("supplier", f"There is no supplier {action.payload.get('supplier')} any more.")]
        if approved_version is not None and supplier.version != approved_version:
            return [
                BindingFailure(
                    "supplier_version",
                    f"The supplier's contacts changed since the approval (approved at version {approved_version}, "
                    f"now {supplier.version}).",
                )
            ]
        problem = self._contact_problem(action)
        return [BindingFailure("contact", problem)] if problem else []
