"""The key the audit trail's statements are signed with (checkpoints, retention tombstones):
held outside the database, in settings, so that whoever can write the tables cannot sign."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def signing_key() -> bytes:
    key = settings.TRAIL_SIGNING_KEY
    if not key:
        raise ImproperlyConfigured("TRAIL_SIGNING_KEY is not set: the audit trail's checkpoints cannot be signed")
    return str(key).encode("utf-8")
