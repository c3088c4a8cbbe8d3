"""Response headers and session limits that apply to every page, the admin and the API.

- ``SecurityHeadersMiddleware`` adds Permissions-Policy to every answer, and
  ``Cache-Control: no-store`` to every answer given to a signed-in person or an agent: those
  pages carry customer names, amounts and tokens' prefixes, which must not stay in a browser's
  or a proxy's cache after the session ends. Public static files keep their own caching.
- ``SessionExpiryMiddleware`` ends a session after an idle period and, whatever the activity,
  a fixed time after the login. Django's own ``SESSION_COOKIE_AGE`` cannot do either alone: it
  is absolute when the session is not saved on every request, and sliding when it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

Handler = Callable[[HttpRequest], HttpResponse]

# Session keys: when the session was last used, and when the person logged in (epoch seconds).
LAST_SEEN_KEY = "console_last_seen"
STARTED_KEY = "console_started"
# Written at most this often, so that a page polling every few seconds does not turn every
# read into a session write.
LAST_SEEN_RESOLUTION_SECONDS = 30


def _carries_private_data(request: HttpRequest) -> bool:
    if request.path.startswith(settings.STATIC_URL if settings.STATIC_URL.startswith("/") else "/static/"):
        return False
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return True
    # The agent API authenticates by bearer token, not by session; its answers are agents' data.
    return request.path.startswith("/api/") or "Authorization" in request.headers


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = getattr(settings, "PERMISSIONS_POLICY", "")
        if policy and not response.has_header("Permissions-Policy"):
            response["Permissions-Policy"] = policy
        if _carries_private_data(request):
            add_never_cache_headers(response)  # no-cache, no-store, must-revalidate, private
        return response


def session_expired(*, last_seen: float | None, started: float | None, now: float) -> str | None:
    """Why a session must end now ("idle" or "max_age"), or None while it may go on."""
    if started is not None and now - started > settings.SESSION_MAX_AGE_SECONDS:
        return "max_age"
    if last_seen is not None and now - last_seen > settings.SESSION_IDLE_TIMEOUT_SECONDS:
        return "idle"
    return None


class SessionExpiryMiddleware:
    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            now = time.time()
            session = request.session
            expired = session_expired(
                last_seen=session.get(LAST_SEEN_KEY), started=session.get(STARTED_KEY), now=now
            )
            if expired:
                # logout() flushes the session and replaces request.user with AnonymousUser:
                # the view below answers as to anyone signed out (the login redirect).
                logout(request)
            else:
                session.setdefault(STARTED_KEY, now)
                if now - float(session.get(LAST_SEEN_KEY) or 0) >= LAST_SEEN_RESOLUTION_SECONDS:
                    session[LAST_SEEN_KEY] = now
        return self.get_response(request)
