"""Outbound HTTP to an address that a user or an agent chose (today: agent webhooks).

Such an address must never reach the console's own network: its database, its sandboxes, a
cloud metadata service or anything else on loopback, private, link-local or unique-local
addresses. Three rules hold that line:

- **Resolve, then judge every address.** ``egress_check_url`` resolves the host and refuses
  it unless every address is public. IPv4-mapped IPv6 (``::ffff:127.0.0.1``) is judged as the
  IPv4 address it carries, and NAT64, 6to4 and carrier-grade NAT ranges are refused as well.
  It runs when the owner registers the URL, so a mistake is named at once.
- **Connect to the address that was judged.** ``egress_post`` sends through
  requests-hardened's ``IPFilterAdapter`` (Saleor's library for its own webhooks): it resolves
  once, refuses a non-public answer, and connects to that very address while keeping the
  name for the Host header and TLS. A name that resolved to a public address at registration
  and to loopback at delivery (DNS rebinding) is refused at delivery.
- **No redirects**, so a public receiver cannot bounce the request inward.

``AGENT_WEBHOOK_ALLOW_LOOPBACK`` lets tests and a one-machine demo deliver to a receiver on
127.0.0.1; it is off by default and ``manage.py check --deploy`` reports it. Deployments with
an egress proxy (Stripe's smokescreen is the known pattern) set ``AGENT_WEBHOOK_PROXY_URL``;
the address checks still run first.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from django.conf import settings
from requests_hardened.ip_filter import EXTRA_BLOCKED_NET_RANGES, InvalidIPAddress
from requests_hardened.ip_filter_adapter import IPFilterAdapter

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# What is kept of a receiver's answer: enough to tell a person why it refused, too little to
# turn the delivery log into a way of reading someone else's service.
EXCERPT_CHARS = 200


class EgressRefused(requests.RequestException):
    """The address is not a public one; nothing was sent. The message says why, in words for
    the person who chose the address."""


@dataclass(frozen=True)
class EgressAnswer:
    status_code: int
    excerpt: str


def _as_judged(address: IPAddress) -> IPAddress:
    # ::ffff:a.b.c.d is the IPv4 host a.b.c.d to the kernel; judge it as that.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def egress_address_refusal(address: IPAddress, *, allow_loopback: bool) -> str | None:
    """Why ``address`` may not be reached, or None when it may."""
    judged = _as_judged(address)
    if judged.is_loopback:
        return None if allow_loopback else f"{address} is this machine (loopback)"
    if judged.is_link_local:
        return f"{address} is a link-local address (cloud metadata services live there)"
    if judged.is_multicast:
        return f"{address} is a multicast address"
    if any(judged in network for network in EXTRA_BLOCKED_NET_RANGES):
        return f"{address} is in a translation or carrier-grade NAT range"
    if not judged.is_global:
        return f"{address} is a private or reserved address"
    return None


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [ipaddress.ip_address(str(answer[4][0]).split("%", 1)[0]) for answer in answers]


def _is_literal_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def egress_check_url(url: str) -> None:
    """Refuse a URL whose host is, or resolves to, any address that is not public.

    A name that does not resolve now is let through: it cannot reach anything yet, and the
    check at delivery judges whatever it resolves to then."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host:
        raise EgressRefused("The URL has no host name.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise EgressRefused("The URL's port is not a number between 0 and 65535.") from None
    allow_loopback = settings.AGENT_WEBHOOK_ALLOW_LOOPBACK
    for address in _resolve(host, port):
        refusal = egress_address_refusal(address, allow_loopback=allow_loopback)
        if refusal is not None:
            where = refusal if _is_literal_address(host) else f"{host} resolves to {refusal}"
            raise EgressRefused(f"The console only sends to public addresses: {where}.")


def _sanitised(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else " " for ch in text[: EXCERPT_CHARS * 2])
    return " ".join(printable.split())[:EXCERPT_CHARS]


def _session() -> requests.Session:
    allow_loopback = settings.AGENT_WEBHOOK_ALLOW_LOOPBACK
    session = requests.Session()
    # Environment proxies (HTTP_PROXY and friends) would route around the checks: only the
    # configured egress proxy is used.
    session.trust_env = False
    session.mount("http://", IPFilterAdapter(is_https_proto=False, allow_loopback=allow_loopback))
    session.mount("https://", IPFilterAdapter(is_https_proto=True, allow_loopback=allow_loopback))
    return session


def egress_post(url: str, *, body: bytes, headers: dict[str, str], timeout: float) -> EgressAnswer:
    """POST ``body`` to ``url`` under the rules above. Raises ``EgressRefused`` for an address
    that is not public, and requests' own errors for a receiver that could not be reached."""
    egress_check_url(url)
    proxy = settings.AGENT_WEBHOOK_PROXY_URL
    with _session() as session:
        try:
            answer = session.post(
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                proxies={"http": proxy, "https": proxy} if proxy else None,
            )
        except requests.RequestException as error:
            # The adapter's own refusal (a rebinding between the check above and the connect)
            # names the address in words a person can act on.
            if isinstance(error, InvalidIPAddress):
                raise EgressRefused(f"The console only sends to public addresses: {error} is not one.") from None
            raise
        return EgressAnswer(status_code=answer.status_code, excerpt=_sanitised(answer.text))
