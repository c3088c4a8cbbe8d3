"""Agent webhooks reach public addresses only: no request to the console's own network (SSRF).

The owner chooses the URL, so it is checked when it is registered and again at every delivery,
the connection goes to the address that was checked, redirects are not followed, and only a
short, sanitised excerpt of the answer is kept. No test here sends a packet anywhere but
127.0.0.1: names are given their addresses by patching the resolver.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from actions.agents.webhooks import WebhookInvalid, webhook_deliver, webhook_set_by_owner
from actions.models import AgentWebhook, AgentWebhookAttempt, AgentWebhookDelivery, DeliveryStatus
from actions.services import Actor
from tests.approvals.test_views import propose
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # never contacted: a test that would connect to it fails first


class Answering:
    """A local HTTP server that answers every POST with one fixed status, headers and body, and
    records the Host header of each request it got."""

    def __init__(self, status: int = 200, body: bytes = b"ok", headers: dict[str, str] | None = None) -> None:
        self.hosts: list[str] = []
        answering = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                answering.hosts.append(self.headers.get("Host", ""))
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def answering() -> Iterator[Callable[..., Answering]]:
    started: list[Answering] = []

    def start(**kwargs: Any) -> Answering:
        server = Answering(**kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(autouse=True)
def quiet(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    monkeypatch.setattr("actions.foundation.outbox.webhook_publish", lambda pk, countdown=None: None)
    monkeypatch.setattr("actions.agents.webhooks.webhook_publish", lambda pk, countdown=None: None)


class Resolver:
    """Stands in for DNS: each name answers from a script, one answer per lookup (the last one
    repeats); other hosts (literal addresses) resolve as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scripts: dict[str, list[str]] = {}
        self.lookups: list[str] = []
        real = socket.getaddrinfo

        def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else str(host)
            if name not in self.scripts:
                return real(host, port, *args, **kwargs)
            self.lookups.append(name)
            script = self.scripts[name]
            address = script.pop(0) if len(script) > 1 else script[0]
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sockaddr: tuple[Any, ...] = (
                (address, int(port or 0), 0, 0) if family == socket.AF_INET6 else (address, int(port or 0))
            )
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)]

        monkeypatch.setattr(socket, "getaddrinfo", fake)

    def answer(self, name: str, *addresses: str) -> None:
        self.scripts[name] = list(addresses)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    return Resolver(monkeypatch)


REFUSED_AT_REGISTRATION = [
    "http://localhost:8000/reset",
    "http://127.0.0.1:8000/reset",
    "http://127.1/reset",
    "http://[::1]:8000/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:a9fe:a9fe]/latest/meta-data/",
    "http://10.0.0.1/",
    "http://192.168.1.10/",
    "http://172.16.0.1/",
    "http://100.64.0.1/",
    "http://0.0.0.0:8000/",
    "http://[fd00::1]/",
    "http://[fe80::1]/",
    "http://[64:ff9b::7f00:1]/",
    "http://224.0.0.1/",
]


@pytest.mark.parametrize("url", REFUSED_AT_REGISTRATION)
def test_it_refuses_a_url_that_points_into_the_consoles_own_network(agent: Any, agent_owner: Any, url: str) -> None:
    with pytest.raises(WebhookInvalid) as refused:
        webhook_set_by_owner(agent=agent, user=agent_owner, url=url)
    message = str(refused.value)
    assert "public addresses" in message or "not an http(s) URL" in message
    assert not AgentWebhook.objects.filter(agent=agent).exists()


@pytest.mark.parametrize(
    "url", ["http://localhost:8000/reset", "http://169.254.169.254/latest/meta-data/", "http://[::1]:8000/"]
)
def test_the_owners_page_answers_400_naming_the_problem_and_saves_nothing(
    agent: Any, agent_owner: Any, url: str
) -> None:
    client = Client()
    client.login(username=agent_owner.username, password=PASSWORD)
    answer = client.post(f"/account/agents/{agent.pk}/webhook", {"url": url})
    assert answer.status_code == 400
    assert "public addresses" in answer.content.decode()
    assert not AgentWebhook.objects.filter(agent=agent).exists()


def test_a_name_that_resolves_to_loopback_is_refused(agent: Any, agent_owner: Any, resolver: Resolver) -> None:
    resolver.answer("hooks.agent.test", "127.0.0.1")
    with pytest.raises(WebhookInvalid, match=r"hooks\.agent\.test resolves to 127\.0\.0\.1"):
        webhook_set_by_owner(agent=agent, user=agent_owner, url="https://hooks.agent.test/events")
    assert not AgentWebhook.objects.filter(agent=agent).exists()


def test_a_public_name_is_accepted(agent: Any, agent_owner: Any, resolver: Resolver) -> None:
    resolver.answer("hooks.agent.test", PUBLIC)
    assert webhook_set_by_owner(agent=agent, user=agent_owner, url="https://hooks.agent.test/events") is not None


def _one_delivery(agent: Any) -> AgentWebhookDelivery:
    propose(Actor.for_agent(agent))
    return AgentWebhookDelivery.objects.get(agent=agent, event_type="action.proposed")


def test_a_name_that_resolves_elsewhere_at_delivery_is_refused_there(
    agent: Any, agent_owner: Any, resolver: Resolver, answering: Callable[..., Answering]
) -> None:
    """DNS rebinding: public when registered, this machine when delivered. The local server
    stands where the second answer points; it must get nothing."""
    inside = answering()
    resolver.answer("hooks.agent.test", PUBLIC, "127.0.0.1")
    webhook_set_by_owner(agent=agent, user=agent_owner, url=f"http://hooks.agent.test:{inside.port}/events")
    delivery = _one_delivery(agent)

    assert webhook_deliver(delivery.pk) == "retry scheduled"
    assert inside.hosts == []
    attempt = AgentWebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and attempt.succeeded is False
    assert "public addresses" in attempt.error and "127.0.0.1" in attempt.error


def test_a_rebinding_between_the_check_and_the_connection_is_refused(
    agent: Any, agent_owner: Any, resolver: Resolver, answering: Callable[..., Answering]
) -> None:
    """The delivery's own check sees a public address, the next lookup (the one a plain client
    would connect to) says loopback: the connection is judged on the address it uses."""
    inside = answering()
    resolver.answer("hooks.agent.test", PUBLIC)
    webhook_set_by_owner(agent=agent, user=agent_owner, url=f"http://hooks.agent.test:{inside.port}/events")
    delivery = _one_delivery(agent)
    resolver.answer("hooks.agent.test", PUBLIC, "127.0.0.1")

    webhook_deliver(delivery.pk)
    assert inside.hosts == []
    attempt = AgentWebhookAttempt.objects.get(delivery=delivery)
    assert attempt.succeeded is False and "public addresses" in attempt.error


def test_the_connection_goes_to_the_checked_address_and_keeps_the_name(
    agent: Any, agent_owner: Any, resolver: Resolver, answering: Callable[..., Answering], settings: Any
) -> None:
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    receiver = answering()
    resolver.answer("hooks.agent.test", "127.0.0.1")
    webhook_set_by_owner(agent=agent, user=agent_owner, url=f"http://hooks.agent.test:{receiver.port}/events")
    delivery = _one_delivery(agent)
    resolver.lookups.clear()

    assert webhook_deliver(delivery.pk) == "delivered"
    assert receiver.hosts == [f"hooks.agent.test:{receiver.port}"]
    # The name is resolved by the checks and never again by a client that would connect elsewhere.
    assert resolver.lookups == ["hooks.agent.test", "hooks.agent.test"]


def test_a_redirect_is_not_followed(
    agent: Any, agent_owner: Any, answering: Callable[..., Answering], settings: Any
) -> None:
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    target = answering()
    bouncing = answering(status=302, body=b"", headers={"Location": f"http://127.0.0.1:{target.port}/reset"})
    webhook_set_by_owner(agent=agent, user=agent_owner, url=f"http://127.0.0.1:{bouncing.port}/hooks")
    delivery = _one_delivery(agent)

    webhook_deliver(delivery.pk)
    assert len(bouncing.hosts) == 1
    assert target.hosts == []
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING and delivery.last_status_code == 302


def test_only_a_short_sanitised_excerpt_of_the_answer_is_kept(
    agent: Any, agent_owner: Any, answering: Callable[..., Answering], settings: Any
) -> None:
    settings.AGENT_WEBHOOK_ALLOW_LOOPBACK = True
    secret_page = b"\x1b[31mroot:x:0:0\r\n" + b"A" * 5000
    talkative = answering(status=500, body=secret_page)
    webhook_set_by_owner(agent=agent, user=agent_owner, url=f"http://127.0.0.1:{talkative.port}/hooks")
    delivery = _one_delivery(agent)

    webhook_deliver(delivery.pk)
    attempt = AgentWebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code == 500
    assert len(attempt.response_excerpt) <= 200
    assert "\x1b" not in attempt.response_excerpt and "\r" not in attempt.response_excerpt
    assert attempt.response_excerpt.startswith("[31mroot:x:0:0 AAAA")
