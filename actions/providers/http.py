"""HTTP sessions for the receivers' adapters: one keep-alive ``requests.Session`` per thread.

Two things the adapters need and ``requests`` does not give by default:

- **One session per thread.** A dispatcher process has many calls in flight, one per thread.
  ``requests`` does not promise that a Session is safe to share across threads, and a session
  per call would open a new connection for every call. ``ThreadSessions`` keeps one per thread.
- **The environment read once, not on every call.** With ``trust_env`` on (the default), every
  request walks ``os.environ`` for proxy variables, ``NO_PROXY`` and CA bundles: measured in the
  dispatcher profile, that was a third of the HTTP client's CPU per refund. These sessions read
  the same variables once, when the session is made, and apply them to every call: a proxy set
  in the environment is still used; a change to it takes effect when the process restarts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

import requests
from requests.utils import get_environ_proxies


def environment_session(*, base_url: str, headers: Mapping[str, str] | None = None) -> requests.Session:
    """A session that reads the environment's proxy and CA settings for ``base_url`` now, once."""
    session = requests.Session()
    session.trust_env = False
    # What trust_env would have looked up on every call: the proxies that apply to this
    # receiver's address (none when NO_PROXY covers it), and a CA bundle named in the environment.
    session.proxies.update(get_environ_proxies(base_url))
    ca_bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if ca_bundle:
        session.verify = ca_bundle
    if headers:
        session.headers.update(headers)
    return session


class ThreadSessions:
    """One session per thread, made on the thread's first call and kept (keep-alive)."""

    def __init__(self, make: Callable[[], requests.Session]) -> None:
        self._make = make
        self._local = threading.local()

    def current(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self._make()
        return session
