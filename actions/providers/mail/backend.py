"""Django's SMTP email backend, noting whether a message's content left for the relay.

SMTP has no idempotency key and no lookup, so what an error means depends on when it came:
a refusal before the DATA command's content was sent proves the relay never had the message;
a dropped connection or a timeout after it leaves the message possibly delivered. smtplib's
exceptions do not say which (``SMTPDataError`` is raised both for a refused DATA command and for
a refused message), so this backend's connection records the moment the content starts to go.
"""

from __future__ import annotations

import re
import smtplib
from typing import Any

from django.core.mail.backends.smtp import EmailBackend as DjangoSMTPBackend

_LEADING_DOT = re.compile(rb"(?m)^\.")


class PhaseTrackingMixin:
    """``content_sent`` turns true once the relay said 354 and the content is about to go: from
    then on the relay may keep the message whatever happens next."""

    content_sent: bool = False

    def data(self, msg: Any) -> tuple[int, bytes]:
        # smtplib.SMTP.data, with the one line that notes the phase.
        smtp: Any = self
        smtp.putcmd("data")
        code, repl = smtp.getreply()
        if code != 354:
            smtp.close()
            raise smtplib.SMTPDataError(code, repl)
        if isinstance(msg, str):
            msg = smtplib._fix_eols(msg).encode("ascii")  # type: ignore[attr-defined]
        body = _LEADING_DOT.sub(b"..", msg)
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        self.content_sent = True
        smtp.send(body + b".\r\n")
        return smtp.getreply()  # type: ignore[no-any-return]


class TrackingSMTP(PhaseTrackingMixin, smtplib.SMTP):
    pass


class TrackingSMTPSSL(PhaseTrackingMixin, smtplib.SMTP_SSL):
    pass


class EmailBackend(DjangoSMTPBackend):
    """Django's SMTP backend whose open ``connection`` says whether the content was sent."""

    @property
    def connection_class(self) -> type[smtplib.SMTP]:  # type: ignore[override]
        return TrackingSMTPSSL if self.use_ssl else TrackingSMTP
