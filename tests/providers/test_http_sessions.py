"""The receivers' HTTP sessions: one per thread, kept, with the environment read once.

The sessions stop ``requests`` from walking the environment on every call (a third of the HTTP
client's CPU per refund in the dispatcher profile), so these tests pin that what the environment
says still applies: a proxy, NO_PROXY, a CA bundle.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import stripe
import urllib3

from actions.providers.accounting.client import AccountingClient
from actions.providers.base import AmbiguousError
from actions.providers.http import ThreadSessions, environment_session
from actions.providers.stripe_adapter import (
    StripeProvider,
    _http_client_for,
    _PoolPerThreadClient,
    _SessionPerThreadClient,
    map_create_error,
)
from tests.providers.sandbox_client import API_KEY, SandboxClient
from tests.providers.test_stripe_adapter import _request

RECEIVER = "http://receiver.invalid:8080"


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listened, so nobody else takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _in_a_thread(call: Callable[[], Any]) -> Any:
    """The call's result, made in a thread of its own (these tests need no database connection,
    so tests.threads.run_at_once, which opens one per thread, does not fit)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(timeout=10)
    return result[0]


def test_each_thread_keeps_one_session_and_no_two_threads_share_one() -> None:
    sessions = ThreadSessions(requests.Session)
    mine = sessions.current()
    assert sessions.current() is mine
    theirs = _in_a_thread(sessions.current)
    assert isinstance(theirs, requests.Session) and theirs is not mine


def test_the_proxy_in_the_environment_applies_though_the_calls_no_longer_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    session = environment_session(base_url=RECEIVER)
    assert session.trust_env is False
    assert session.proxies == {"http": "http://proxy.invalid:3128"}


def test_a_receiver_that_no_proxy_covers_is_called_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "receiver.invalid")
    assert environment_session(base_url=RECEIVER).proxies == {}


def test_a_ca_bundle_named_in_the_environment_is_the_one_verified_against(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/receiver-ca.pem")
    assert environment_session(base_url=RECEIVER).verify == "/etc/ssl/certs/receiver-ca.pem"
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert environment_session(base_url=RECEIVER).verify is True


def test_the_accounting_client_gives_each_thread_its_own_session_with_the_credentials() -> None:
    client = AccountingClient(api_base=RECEIVER, access_token="tok", tenant_id="tenant-1", timeout_seconds=1)
    mine = client.session
    theirs = _in_a_thread(lambda: client.session)
    assert client.session is mine and theirs is not mine
    for session in (mine, theirs):
        assert isinstance(session, requests.Session)
        assert session.headers["Authorization"] == "Bearer tok"
        assert session.headers["xero-tenant-id"] == "tenant-1"


@pytest.mark.processes
def test_a_refund_goes_through_the_proxy_the_environment_names(
    sandbox: SandboxClient, monkeypatch: pytest.MonkeyPatch, dead_port: int
) -> None:
    """With the proxy variables read once per session, a proxy still carries the call: here one
    that refuses connections, so the refund cannot be sent and its outcome is unknown."""
    sandbox.seed_charge("ch_1", 5000, "eur")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead_port}")
    through_proxy = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2)
    with pytest.raises(AmbiguousError):
        through_proxy.create_refund(_request())

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the test's own sandbox client reads it per call
    assert sandbox.ledger() == []
    direct = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2)
    assert direct.create_refund(_request()).amount_minor == 1000
    assert len(sandbox.ledger()) == 1


def test_with_no_proxy_for_the_receiver_stripe_calls_go_through_urllib3_with_a_pool_per_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = _http_client_for(api_base=RECEIVER, timeout=3)
    assert isinstance(client, _PoolPerThreadClient)
    mine = client._pool()
    assert client._pool() is mine
    assert _in_a_thread(client._pool) is not mine
    # The timeout applies to the connection and to every read, as requests' timeout=3 did.
    assert (client._timeout.connect_timeout, client._timeout.read_timeout) == (3, 3)

    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert isinstance(_http_client_for(api_base=RECEIVER, timeout=3), _SessionPerThreadClient)
    # A proxy for plain http says nothing of an https receiver.
    assert isinstance(_http_client_for(api_base="https://receiver.invalid", timeout=3), _PoolPerThreadClient)
    monkeypatch.setenv("NO_PROXY", "receiver.invalid")
    assert isinstance(_http_client_for(api_base=RECEIVER, timeout=3), _PoolPerThreadClient)


@pytest.mark.parametrize(
    ("raised", "should_retry"),
    [
        (urllib3.exceptions.NewConnectionError(None, "refused"), True),  # type: ignore[arg-type]
        (urllib3.exceptions.ReadTimeoutError(None, "/v1/refunds", "timed out"), True),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("Connection aborted."), True),
        (urllib3.exceptions.SSLError("certificate verify failed"), False),
        (ValueError("a local problem"), False),
    ],
)
def test_a_transport_error_is_the_sdks_connection_error_as_its_own_clients_raise_it(
    monkeypatch: pytest.MonkeyPatch, raised: Exception, should_retry: bool
) -> None:
    """The adapter maps every APIConnectionError to ambiguous (map_create_error): whatever the
    transport raised, the refund's outcome is unknown, never failed."""
    client = _PoolPerThreadClient(timeout=1)

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(client._pool(), "urlopen", fail)
    with pytest.raises(stripe.APIConnectionError) as error:
        client.request("post", f"{RECEIVER}/v1/refunds", {}, "amount=1")

    assert error.value.should_retry is should_retry
    assert error.value.__cause__ is raised
    assert isinstance(map_create_error(error.value), AmbiguousError)


@pytest.mark.processes
def test_a_thread_sends_its_refunds_over_one_kept_connection(sandbox: SandboxClient) -> None:
    sandbox.seed_charge("ch_1", 5000, "eur")
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2)
    client = provider._client._requestor._client
    assert isinstance(client, _PoolPerThreadClient)

    for number in range(3):
        assert provider.create_refund(_request(f"act-{number}", amount_minor=100)).amount_minor == 100

    assert client._pool().connection_from_url(sandbox.url).num_connections == 1
    assert len(sandbox.ledger()) == 3


class _Answers(stripe.HTTPClient):
    """A transport that answers every call with the given status and body."""

    name = "fixed"

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.answer = (body, status, {"Content-Type": "application/json"})

    def request(self, method: str, url: str, headers: Any, post_data: Any = None) -> Any:  # type: ignore[override]
        return self.answer

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'"refunded"', b'{"object": "refund", "id": "re_1"}', b'{"object": "charge", "id": "ch_1"}'],
)
def test_a_2xx_answer_that_is_no_readable_refund_is_ambiguous_never_failed(body: bytes) -> None:
    """raw_request hands back the parsed JSON whatever its shape: a list, a string, a refund
    missing its fields or another object. The refund was very likely made, so its outcome is
    unknown and reconciliation asks."""
    provider = StripeProvider(api_key=API_KEY, api_base=RECEIVER, timeout_seconds=1)
    provider._client._requestor._client = _Answers(200, body)

    with pytest.raises(AmbiguousError) as unreadable:
        provider.create_refund(_request())

    assert unreadable.value.code == "unreadable_response"
    assert unreadable.value.http_status == 200
