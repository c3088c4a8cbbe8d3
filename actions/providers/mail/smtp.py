"""The SMTP adapter: one message, sent once, through Django's email framework.

Every outside call has the same shape: the attempt is on record before this runs, the send
happens outside any transaction, and what the relay said comes back as a result or a typed
error whose type says what it proves. The kind's answer table (``actions.kinds.supplier_email.contract``)
maps those types to outcomes; this module knows nothing of actions.
"""

from __future__ import annotations

import contextlib
import smtplib
from dataclasses import dataclass, field
from typing import Any

from django.core.mail import EmailMessage, get_connection


@dataclass(frozen=True)
class OutgoingEmail:
    message_id: str  # "<...@...>", stable for the action
    from_email: str
    to: str
    subject: str
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Accepted:
    """The relay answered 250 to the message: it took responsibility for it."""

    message_id: str
    reply: str


class MailError(Exception):
    code: str = "mail_error"
    http_status: int | None = None

    def __init__(self, message: str, *, smtp_code: int | None = None, content_sent: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.smtp_code = smtp_code
        self.content_sent = content_sent
        self.raw: dict[str, Any] = {"smtp_code": smtp_code, "content_sent": content_sent, "message": message}


class MailNotSent(MailError):
    """The relay never had the message: it refused before the content (4xx), or the connection
    failed before the content left. Sending it later is not a repeat."""

    code = "not_sent"


class MailRejected(MailError):
    """The relay refused the message for good (5xx)."""

    code = "rejected"


class MailAmbiguous(MailError):
    """The content may have reached the relay and no final answer came back (dropped connection,
    timeout, a 4xx after the content), or the backend cannot say when it failed."""

    code = "ambiguous"


def _smtp_code(error: BaseException) -> int | None:
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in error.recipients.values()]
        # One permanent refusal decides: the address is refused for good.
        return max(codes) if codes else None
    code = getattr(error, "smtp_code", None)
    return int(code) if isinstance(code, int) else None


def classify(error: BaseException, *, content_sent: bool | None) -> MailError:
    """What an exception from the send proves, given whether the content had left."""
    code = _smtp_code(error)
    text = f"{type(error).__name__}: {error}"
    if code is not None and 500 <= code < 600:
        return MailRejected(
            f"The relay refused the message for good ({code}): {text}", smtp_code=code, content_sent=content_sent
        )
    if content_sent is False:
        # Nothing left this side: a 4xx, a refused or dropped connection, a timeout before DATA.
        return MailNotSent(
            f"The relay did not take the message ({text}); nothing was sent.", smtp_code=code, content_sent=False
        )
    if content_sent is None:
        return MailAmbiguous(
            f"The backend failed ({text}) and cannot say whether the message left.", smtp_code=code, content_sent=None
        )
    return MailAmbiguous(f"The content was sent and no final answer came ({text}).", smtp_code=code, content_sent=True)


class SmtpMailer:
    """Sends through the configured ``EMAIL_BACKEND``; never retries on its own."""

    def __init__(self, *, timeout_seconds: float | None = None) -> None:
        self.timeout_seconds = timeout_seconds

    def send(self, email: OutgoingEmail) -> Accepted:
        message = EmailMessage(
            subject=email.subject,
            body=email.body,
            from_email=email.from_email,
            to=[email.to],
            headers={"Message-ID": email.message_id, **email.headers},
        )
        kwargs: dict[str, Any] = {"fail_silently": False}
        if self.timeout_seconds is not None:
            kwargs["timeout"] = self.timeout_seconds
        backend: Any = get_connection(**kwargs)
        try:
            # Opened here, not inside send_messages, so that the connection (and what it knows
            # about the phase) is still there when the send fails.
            backend.open()
        except (OSError, smtplib.SMTPException) as error:
            raise classify(error, content_sent=False) from error
        try:
            sent = backend.send_messages([message])
        except (TimeoutError, OSError, smtplib.SMTPException) as error:
            raise classify(error, content_sent=_content_sent(backend)) from error
        finally:
            # The answer is already decided; a failed QUIT changes nothing.
            with contextlib.suppress(OSError, smtplib.SMTPException):
                backend.close()
        if sent != 1:
            raise MailAmbiguous("The backend reported no message sent and raised nothing.", content_sent=None)
        return Accepted(message_id=email.message_id, reply="250")


def _content_sent(backend: Any) -> bool | None:
    connection = getattr(backend, "connection", None)
    if connection is None or not hasattr(connection, "content_sent"):
        return None  # not the tracking SMTP backend: it cannot say
    return bool(connection.content_sent)
