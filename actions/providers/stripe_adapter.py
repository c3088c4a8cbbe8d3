"""The Stripe provider, built on the official ``stripe`` package (v16, ``StripeClient``).

The same class talks to Stripe in production and to the sandbox in development and tests: only
``api_base`` and the key differ. Every Stripe error is mapped to the contract's error types in
``map_create_error`` and ``map_lookup_error``, following docs/architecture.md section 6.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any, NoReturn

import stripe
import urllib3
from requests.utils import get_environ_proxies, select_proxy

from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    ProviderError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
    retry_after_seconds,
)
from actions.providers.http import environment_session

__all__ = [
    "StripeProvider",
    "map_create_error",
    "map_lookup_error",
    "refund_from_stripe_json",
]

# Error codes that Stripe returns as ordinary 400s but that may mean an earlier attempt of ours
# already consumed the refundable amount: the refund we are unsure about could be the one that
# used it up. Recording FAILED_FINAL here could hide a refund that succeeded, so they are
# ambiguous and reconciliation decides. ``amount_too_large`` is also ambiguous when the amount
# exceeds the whole charge (which no earlier attempt explains); escalation catches that case.
# ``lock_timeout`` means a concurrent request held the charge, which may have been ours.
_AMBIGUOUS_INVALID_REQUEST_CODES = frozenset({"charge_already_refunded", "amount_too_large", "lock_timeout"})

# Stripe's wording for a refund larger than what is left on the charge; matched as well as the
# code because the code on this error is not documented as stable.
_UNREFUNDED_REMAINDER_PHRASE = "greater than unrefunded amount"


class _SessionPerThreadClient(stripe.RequestsClient):
    """The stripe SDK's ``RequestsClient``, whose session per thread reads the environment once.

    The SDK's own client makes a plain ``requests.Session`` per thread, which walks the whole
    environment for proxy settings on every call (``actions.providers.http``). Here each thread's
    session comes from ``environment_session`` instead; everything else (the request, the error
    mapping, the timeout) is the SDK's.
    """

    def __init__(self, *, timeout: float, api_base: str) -> None:
        super().__init__(timeout=timeout)
        self._api_base = api_base

    def _request_internal(self, method: str, url: str, headers: Any, post_data: Any, is_streaming: Any) -> Any:  # type: ignore[override]
        if getattr(self._thread_local, "session", None) is None:
            self._thread_local.session = environment_session(base_url=self._api_base)
        return super()._request_internal(method, url, headers, post_data, is_streaming)


class _PoolPerThreadClient(stripe.HTTPClient):
    """The stripe SDK's HTTP client on urllib3 itself: one keep-alive connection pool per thread.

    urllib3 is what ``requests`` sends through. Calling it directly skips what ``requests`` does
    around each call (the request prepared and hooked, cookies, settings merged, the response
    wrapped): measured on this machine, 1.35 ms of client CPU per refund call through a
    ``requests.Session`` against 0.76 ms through urllib3, on a P-a budget of 5 ms per action (the
    dispatcher's CPU per action, README "Benchmark"). Everything above the transport (headers,
    idempotency keys, errors by status) is still the SDK's. Used when no proxy applies to the
    receiver (``_http_client_for``).

    Errors are the SDK's ``APIConnectionError``, as its own clients raise them, and the adapter
    maps every one to ambiguous: a timeout or a dropped connection may follow an executed
    refund. No retries, no redirects: retrying is reconciliation's decision.
    """

    name = "urllib3"

    def __init__(self, *, timeout: float) -> None:
        super().__init__()
        # As requests takes timeout=t: t to connect, and t for each read.
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)

    def _pool(self) -> urllib3.PoolManager:
        pool: urllib3.PoolManager | None = getattr(self._thread_local, "pool", None)
        if pool is None:
            # maxsize=1: a thread has one call in flight at a time, and keeps that connection.
            pool = self._thread_local.pool = urllib3.PoolManager(
                maxsize=1, cert_reqs="CERT_REQUIRED", ca_certs=stripe.ca_bundle_path
            )
        return pool

    def request(  # type: ignore[override]
        self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None
    ) -> tuple[bytes, int, Mapping[str, str]]:
        try:
            response = self._pool().urlopen(
                method.upper(),
                url,
                body=post_data,
                headers=dict(headers or {}),
                timeout=self._timeout,
                retries=False,
                redirect=False,
            )
            return response.data, response.status, response.headers
        except Exception as error:  # as the SDK's clients: anything raised while calling
            self._raise_connection_error(error)

    def _raise_connection_error(self, error: Exception) -> NoReturn:
        # As the SDK's RequestsClient: a certificate problem is not worth retrying; timeouts,
        # refused and dropped connections are; anything else is a local problem.
        should_retry = isinstance(error, urllib3.exceptions.HTTPError) and not isinstance(
            error, urllib3.exceptions.SSLError
        )
        raise stripe.APIConnectionError(
            f"Unexpected error communicating with the receiver (network error: {type(error).__name__}: {error})",
            should_retry=should_retry,
        ) from error

    def close(self) -> None:
        pool: urllib3.PoolManager | None = getattr(self._thread_local, "pool", None)
        if pool is not None:
            pool.clear()


def _http_client_for(*, api_base: str, timeout: float) -> stripe.HTTPClient:
    """urllib3 directly, unless the environment names a proxy for the receiver: then the
    ``requests`` client, which applies it (urllib3 alone reads no proxy variables). The
    environment is read here, once, as ``environment_session`` reads it once per session."""
    if select_proxy(api_base, get_environ_proxies(api_base)):  # as requests picks one: scheme, host, "all"
        return _SessionPerThreadClient(timeout=timeout, api_base=api_base)
    return _PoolPerThreadClient(timeout=timeout)


def stripe_guarantees(*, key_retention: timedelta, lookup_visibility_delay: timedelta) -> ProviderGuarantees:
    """What Stripe (and its sandbox) guarantees: it replays a key's answer for ``key_retention``,
    and a lookup is authoritative once ``lookup_visibility_delay`` has passed."""
    return ProviderGuarantees(
        honours_idempotency_keys=True,
        key_retention=key_retention,
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=lookup_visibility_delay,
    )


class StripeProvider:
    """Refunds through Stripe's API (or the Stripe-compatible sandbox at ``api_base``)."""

    name = "stripe"

    def __init__(
        self,
        *,
        api_key: str,
        api_base: str,
        timeout_seconds: float = 20.0,
        key_retention: timedelta = timedelta(hours=24),
        lookup_visibility_delay: timedelta = timedelta(seconds=5),
        page_size: int = 100,
        verify_charge_currency: bool = False,
    ) -> None:
        if not api_key:
            raise ValueError("api_key must not be empty")
        if not api_base:
            # No default on purpose: a missing setting must not silently point a development
            # machine at the real API.
            raise ValueError("api_base must not be empty")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if not 1 <= page_size <= 100:
            raise ValueError("page_size must be between 1 and 100 (Stripe's list limit)")
        self.api_base = api_base.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.page_size = page_size
        # Read the charge before every refund and compare currencies in the console as well (one
        # more HTTP call per refund). Off by default: the refund carries its currency and the
        # receiver checks it.
        self.verify_charge_currency = verify_charge_currency
        self.guarantees = stripe_guarantees(
            key_retention=key_retention, lookup_visibility_delay=lookup_visibility_delay
        )
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": self.api_base},
            # The library would retry timeouts, 409s and 5xx on its own. Retries are the
            # console's decision (section 7): an ambiguous answer goes to reconciliation first.
            max_network_retries=0,
            # An explicit client so the timeout is ours, not the library's 80-second default.
            # It keeps one connection per thread (keep-alive): a worker thread reuses its
            # connection to the receiver, and threads never share one.
            http_client=_http_client_for(api_base=self.api_base, timeout=timeout_seconds),
        )

    def __repr__(self) -> str:
        return f"StripeProvider(api_base={self.api_base!r})"

    # -- create ------------------------------------------------------------------------------

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        if self.verify_charge_currency:
            self._check_charge_currency(req)
        params: dict[str, Any] = {
            "charge": req.charge,
            "amount": req.amount_minor,
            # The currency the console believes the charge is in (the order's, checked at the
            # proposal). The receiver refuses a refund whose currency differs from the charge's
            # (currency_mismatch, a definitive 400), so no charge read is needed before each refund.
            "currency": req.currency,
            "metadata": dict(req.metadata),
        }
        if req.reason is not None:
            params["reason"] = req.reason
        try:
            # The SDK's raw_request is refunds.create without the StripeObject built from the
            # answer (about 0.2 ms of CPU a refund), which the adapter read back as JSON anyway:
            # the same request, the same headers and idempotency key, the same errors raised
            # by status.
            response = self._client.raw_request("post", "/v1/refunds", **params, idempotency_key=req.idempotency_key)
        except stripe.StripeError as exc:
            raise map_create_error(exc) from exc
        try:
            if not isinstance(response.data, dict):
                raise ValueError(f"expected a JSON object, got {type(response.data).__name__}")
            return refund_from_stripe_json(response.data)
        except (KeyError, TypeError, ValueError) as exc:
            # A 2xx means Stripe very likely created the refund; an answer that cannot be read is
            # therefore ambiguous, never a failure.
            raise AmbiguousError(
                f"Stripe answered the refund request with an unreadable refund: {exc}",
                code="unreadable_response",
                http_status=response.code,
            ) from exc

    def _check_charge_currency(self, req: CreateRefund) -> None:
        """Refuse a refund whose currency differs from the charge's, before anything is sent.

        Stripe's refund endpoint takes no currency for a charge refund: it would refund
        ``amount_minor`` in the charge's currency, so a console that believes the order is in EUR
        while the charge is in JPY would refund the wrong sum. The read is safe to repeat.
        """
        try:
            charge = self._client.v1.charges.retrieve(req.charge)
        except stripe.InvalidRequestError as exc:
            if exc.code == "resource_missing":
                raise DefinitiveError(
                    f"charge {req.charge} does not exist at Stripe: {exc.user_message}",
                    code="resource_missing",
                    http_status=exc.http_status,
                    raw=_error_json(exc),
                ) from exc
            raise _ambiguous_before_create(exc) from exc
        except stripe.StripeError as exc:
            raise _ambiguous_before_create(exc) from exc
        currency = str(_raw_json(charge).get("currency", "")).lower()
        if currency != req.currency:
            raise DefinitiveError(
                f"refund currency {req.currency} does not match charge {req.charge} currency {currency or '(none)'}",
                code="currency_mismatch",
            )

    # -- lookups -----------------------------------------------------------------------------

    def get_refund(self, refund_id: str) -> ProviderRefund:
        if not refund_id:
            raise ValueError("refund_id must not be empty")
        try:
            refund = self._client.v1.refunds.retrieve(refund_id)
        except stripe.StripeError as exc:
            raise map_lookup_error(exc) from exc
        return _parse_for_lookup(_raw_json(refund))

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        # Stripe has no search over refund metadata, so list every refund on the charge and
        # filter here. A charge carries few refunds, so this stays a page or two.
        if not charge:
            raise ValueError("charge must not be empty")
        found = []
        for refund in self._list_refunds({"charge": charge}):
            if action_id is None or refund.metadata.get("action_id") == action_id:
                found.append(refund)
        return found

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        # Stripe's list filter on the creation time: the audit reads one window at a time, and
        # pages inside it with starting_after like any other list.
        created: dict[str, int] = {}
        if created_from is not None:
            created["gte"] = created_from
        if created_before is not None:
            created["lt"] = created_before
        return self._list_refunds({"created": created} if created else {})

    def _list_refunds(self, filters: Mapping[str, Any]) -> Iterator[ProviderRefund]:
        # Manual pagination with starting_after, so each page's error goes through the same
        # mapping and the generator never skips a page silently.
        starting_after: str | None = None
        while True:
            params: dict[str, Any] = {**filters, "limit": self.page_size}
            if starting_after is not None:
                params["starting_after"] = starting_after
            try:
                page = self._client.v1.refunds.list(params=params)  # type: ignore[arg-type]
            except stripe.StripeError as exc:
                raise map_lookup_error(exc) from exc
            body = _raw_json(page)
            data = body.get("data")
            if not isinstance(data, list):
                raise LookupFailed("Stripe returned a refund list without data", code="bad_list")
            for item in data:
                yield _parse_for_lookup(item)
            if not body.get("has_more") or not data:
                return
            starting_after = str(data[-1]["id"])


# -- parsing -----------------------------------------------------------------------------------


def refund_from_stripe_json(data: Mapping[str, Any]) -> ProviderRefund:
    """Build a ProviderRefund from a Stripe refund object (a dict parsed from its JSON)."""
    if data.get("object", "refund") != "refund":
        raise ValueError(f"expected a refund object, got {data.get('object')!r}")
    charge = data.get("charge")
    if isinstance(charge, Mapping):  # an expanded charge
        charge = charge.get("id")
    amount = data["amount"]
    created = data["created"]
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise ValueError(f"refund amount is not an integer: {amount!r}")
    if isinstance(created, bool) or not isinstance(created, int):
        raise ValueError(f"refund created is not an integer: {created!r}")
    metadata = data.get("metadata") or {}
    return ProviderRefund(
        id=str(data["id"]),
        charge=str(charge or ""),
        amount_minor=amount,
        currency=str(data["currency"]).lower(),
        # Raises ValueError on a status this code does not know, rather than guessing.
        status=RefundStatus(data["status"]),
        metadata={str(k): str(v) for k, v in dict(metadata).items()},
        created=created,
        raw=dict(data),
    )


def _parse_for_lookup(data: Mapping[str, Any]) -> ProviderRefund:
    try:
        return refund_from_stripe_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise LookupFailed(f"Stripe returned a refund that cannot be read: {exc}", code="unreadable_response") from exc


def _raw_json(obj: stripe.StripeObject) -> dict[str, Any]:
    """The JSON Stripe sent for ``obj``, falling back to the object's own data."""
    response = obj.last_response
    if response is not None and isinstance(response.data, dict):
        return response.data
    return obj.to_dict()


# -- error mapping (docs/architecture.md section 6, in one place) -----------------------------------------


def _error_json(exc: stripe.StripeError) -> dict[str, Any] | None:
    return exc.json_body if isinstance(exc.json_body, dict) else None


def _error_field(exc: stripe.StripeError, name: str) -> str | None:
    body = _error_json(exc)
    error = body.get("error") if body else None
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) else None


def _code(exc: stripe.StripeError) -> str | None:
    # stripe-python fills ``code`` only for some classes (not for a 409's APIError, nor for
    # RateLimitError), so read it from the body as well.
    return exc.code or _error_field(exc, "code")


def _message(exc: stripe.StripeError) -> str:
    return exc.user_message or str(exc) or type(exc).__name__


def _build(cls: type[ProviderError], exc: stripe.StripeError, code: str | None) -> ProviderError:
    return cls(_message(exc), code=code, http_status=exc.http_status, raw=_error_json(exc))


def map_create_error(exc: stripe.StripeError) -> ProviderError:
    """Map an error from creating a refund to DefinitiveError, AmbiguousError or a mismatch.

    Anything not known to be definitive is ambiguous: calling a refund failed when it may have
    happened risks paying twice, while calling it unknown only costs a reconciliation.
    """
    code = _code(exc)
    status = exc.http_status
    if isinstance(exc, stripe.APIConnectionError):
        # Timeouts, refused and dropped connections: the request may have been executed.
        return _build(AmbiguousError, exc, code or "connection_error")
    if code == "idempotency_key_in_use" or status == 409:
        # Another request with our key is still running; it may well succeed.
        return _build(AmbiguousError, exc, code or "idempotency_key_in_use")
    if isinstance(exc, stripe.IdempotencyError) or _error_field(exc, "type") == "idempotency_error":
        return _build(IdempotencyMismatchError, exc, code or "idempotency_error")
    if isinstance(exc, stripe.RateLimitError) or status == 429:
        return _with_retry_after(_build(AmbiguousError, exc, code or "rate_limit"), exc)
    if isinstance(exc, (stripe.AuthenticationError, stripe.PermissionError)) or status in (
        401,
        403,
    ):
        return _build(ConfigurationError, exc, code or "authentication_error")
    if isinstance(exc, stripe.InvalidRequestError):
        message = (exc.user_message or "").lower()
        if code in _AMBIGUOUS_INVALID_REQUEST_CODES or _UNREFUNDED_REMAINDER_PHRASE in message:
            return _build(AmbiguousError, exc, code or "amount_too_large")
        # Validation of the request itself (bad amount, missing charge, unknown parameter):
        # Stripe refuses these before executing, and the same request will always be refused.
        return _build(DefinitiveError, exc, code or "invalid_request_error")
    # 5xx (APIError), 402 and anything new: possibly executed.
    return _build(AmbiguousError, exc, code or "api_error")


def map_lookup_error(exc: stripe.StripeError) -> ProviderError:
    """Map an error from a read: NotFoundError if authoritative, otherwise LookupFailed."""
    code = _code(exc)
    if isinstance(exc, stripe.InvalidRequestError) and code == "resource_missing":
        return _build(NotFoundError, exc, code)
    if isinstance(exc, stripe.APIConnectionError):
        return _build(LookupFailed, exc, code or "connection_error")
    return _with_retry_after(_build(LookupFailed, exc, code or _error_field(exc, "type") or "api_error"), exc)


def _with_retry_after(error: ProviderError, exc: stripe.StripeError) -> ProviderError:
    """A 429 says when to call again (Retry-After): kept on the error for the engine."""
    if exc.http_status == 429 or isinstance(exc, stripe.RateLimitError):
        error.retry_after = retry_after_seconds((exc.headers or {}).get("Retry-After"))
    return error


def _ambiguous_before_create(exc: stripe.StripeError) -> AmbiguousError:
    """The pre-create charge read failed: nothing was sent, but nothing is proven either.

    It is reported as ambiguous (not definitive) so that a flaky read never turns a refund into
    FAILED_FINAL; reconciliation will find no refund and may retry with the same key.
    """
    mapped = map_lookup_error(exc)
    cls = ConfigurationError if exc.http_status in (401, 403) else AmbiguousError
    return cls(
        f"could not read the charge before refunding: {mapped.message}",
        code=mapped.code,
        http_status=mapped.http_status,
        raw=mapped.raw,
    )
