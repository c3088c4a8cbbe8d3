"""The one shape of "the rules do not allow this": nothing was written, the message is for a person.

Services raise a subclass; views and the API show ``message`` as it is and answer with
``status`` (400 bad input, naming ``field``; 403 who may act; 404 no such thing; 409 the state
or the receiver's answer does not allow it now).
"""

from __future__ import annotations


class Refused(Exception):
    default_status = 409

    def __init__(self, message: str, *, code: str = "refused", status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status if status is not None else self.default_status
        self.field = field
