"""Response headers and session limits that apply to every page, the admin and the API.

- ``SecurityHeadersMiddleware`` adds Permissions-Policy to every answer, and
  ``Cache-Control: no-store`` to every answer given to a signed-in person or an agent: those
  pages carry customer names, amounts and tokens' prefixes, which must not stay in a browser's
  or a proxy's cache after the session ends. Public static files keep their own caching.
- ``SessionExpiryMiddleware`` ends a session a fixed time after the login, whatever the
  activity (``SESSION_MAX_AGE_SECONDS``). The idle timeout is Django's own: the session is saved
  on every request (``SESSION_SAVE_EVERY_REQUEST``), so ``SESSION_COOKIE_AGE`` (the idle
  timeout) slides with each request, on the cookie and on the server's record alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers

Handler = Callable[[HttpRequest], HttpResponse]

# Session key: when the person logged in (epoch seconds), set by the login signal.
STARTED_KEY = "console_started"


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


def session_expired(*, started: float | None, now: float) -> bool:
    """True when a session has passed its absolute cap since the login."""
    return started is not None and now - started > settings.SESSION_MAX_AGE_SECONDS


def session_start_record(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    """``user_logged_in`` receiver: remember when this session's login happened."""
    request.session[STARTED_KEY] = time.time()


class SessionExpiryMiddleware:
    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            started = request.session.get(STARTED_KEY)
            if started is None:
                # A session from before this rule: its cap counts from now.
                request.session[STARTED_KEY] = time.time()
            elif session_expired(started=float(started), now=time.time()):
                # logout() flushes the session and makes request.user anonymous: the view
                # answers as to anyone signed out (the login redirect).
                logout(request)
        return self.get_response(request)


# Django's DEBUG pages carry this tag; the console's own pages never do.
_TECHNICAL_PAGE_MARK = b'<meta name="robots" content="NONE,NOARCHIVE">'


class FriendlyNotFoundMiddleware:
    """The demo's 404: the console's own "Not found" page instead of Django's DEBUG list of URL
    patterns, which tells a newcomer nothing (and lists every address of the console).

    Only in the demo profile (``DEMO_FRIENDLY_404``, which `make start` sets): a developer
    running with DEBUG elsewhere keeps Django's page. With DEBUG off Django renders 404.html
    itself, and this is not installed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code == 404 and _TECHNICAL_PAGE_MARK in getattr(response, "content", b""):
            return render(request, "404.html", status=404)
        return response
