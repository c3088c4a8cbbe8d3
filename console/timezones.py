"""Each person's time zone: chosen on the account page, active for every request they make.

The zone is kept in the session once read, so a page costs no extra query; changing it on the
account page writes ``UserSettings`` and the session together.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from actions.models import UserSettings

SESSION_KEY = "console_time_zone"


@lru_cache(maxsize=1)
def time_zone_choices() -> list[str]:
    return sorted(zoneinfo.available_timezones())


def user_time_zone_get(request: HttpRequest) -> str:
    """The signed-in person's zone name (the console's default for everyone else)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return settings.TIME_ZONE
    name = request.session.get(SESSION_KEY)
    if not name:
        stored = UserSettings.objects.filter(user=user).values_list("time_zone", flat=True).first()
        name = stored or settings.TIME_ZONE
        request.session[SESSION_KEY] = name
    return str(name)


def time_zone_remember(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """At login, keep the person's zone in the new session: no page reads it again."""
    if request is None or not hasattr(request, "session"):
        return
    stored = UserSettings.objects.filter(user=user).values_list("time_zone", flat=True).first()
    request.session[SESSION_KEY] = stored or settings.TIME_ZONE


def user_time_zone_set(*, request: HttpRequest, name: str) -> UserSettings:
    """Store ``name`` (already validated) as the person's zone and use it from now on."""
    assert request.user.is_authenticated, "only a signed-in person has a time zone of their own"
    found = UserSettings.for_user(request.user)
    found.time_zone = name
    found.full_clean()
    found.save(update_fields=["time_zone"])
    request.session[SESSION_KEY] = name
    return found


class UserTimeZoneMiddleware:
    """Activates the person's zone for the request: templates and ``localdate`` follow it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        name = user_time_zone_get(request)
        try:
            timezone.activate(zoneinfo.ZoneInfo(name))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            timezone.deactivate()  # a zone removed from the system since: the default, not a 500
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
