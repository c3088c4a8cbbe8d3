"""A short load run against the agent API served by gunicorn: requests per second and latencies.

    API_RATE_LIMIT_PER_MINUTE=0 make serve            # in one terminal (or any running server)
    python -m tests.bench.bench_api --duration 60     # in another, with the same DATABASE_URL

Not a pytest test: it measures and prints. Bounded on purpose: loopback addresses only, and at
most 60 seconds of load. The per-token rate limit would turn most of the load into 429s, so the
server under test should run with ``API_RATE_LIMIT_PER_MINUTE=0``; 429s are counted apart.

Set-up, through the same database as the server (``DATABASE_URL``): an owner, an agent with
the scopes ``refund`` and ``orders`` and a token, ``--orders`` orders sent over the API, and one
proposal on each (above the auto-approval threshold, so that they wait for a manager and the
run measures the API, not the workers and the payment provider).

The load, from ``--processes`` processes of ``--threads`` threads each, every thread picking
at random by weight:

| weight | request | writes |
|---|---|---|
| 40 | GET /api/v1/actions/{id} | no |
| 20 | GET /api/v1/actions?limit=20 | no |
| 20 | POST /api/v1/orders, an order sent before (the shop's retry) | no |
| 10 | POST /api/v1/refund-requests with a new reference | yes |
| 10 | POST /api/v1/refunds, the same proposal again (the agent's retry) | no |
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any
from urllib.parse import urlsplit

MAX_DURATION_SECONDS = 60
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WEIGHTS = {"get_action": 40, "list_actions": 20, "replay_order": 20, "open_request": 10, "replay_proposal": 10}


def _setup(base: str, orders: int) -> dict[str, Any]:
    """Create the agent and the orders; return what the load threads need."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from actions.agents.services import agent_create, agent_token_issue

    run = uuid.uuid4().hex[:6]
    owner, _ = get_user_model().objects.get_or_create(username="bench-owner")
    agent = agent_create(name=f"bench-{run}", owner=owner, scopes=["orders", "refund"])
    token = agent_token_issue(agent=agent, label="bench").plain
    client = _Client(base, token)
    order_bodies, proposals, action_ids = [], [], []
    for n in range(orders):
        order = {
            "order_number": f"b{run}-{n}",
            "customer_name": "Bench Customer",
            "currency": "EUR",
            "captured_amount": "500.00",
            "charge_reference": f"ch_b{run}_{n}",
            "paid_at": "2026-11-01T12:00:00Z",
        }
        assert client.request("POST", "/api/v1/orders", order)[0] == 201
        status, body = client.request(
            "POST",
            "/api/v1/refund-requests",
            {"order_number": order["order_number"], "external_reference": f"B-{run}-{n}"},
        )
        assert status == 201, body
        proposal = {
            "order_number": order["order_number"],
            "request_number": body["request_number"],
            "amount": "40.00",
            "currency": "EUR",
            "reason_code": "damaged",
        }
        status, body = client.request("POST", "/api/v1/refunds", proposal)
        assert status == 201, body
        order_bodies.append(order)
        proposals.append(proposal)
        action_ids.append(body["action_id"])
    return {"run": run, "token": token, "orders": order_bodies, "proposals": proposals, "action_ids": action_ids}


class _Client:
    """One keep-alive HTTP connection (gunicorn's sync workers close it; it is then reopened)."""

    def __init__(self, base: str, token: str) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.connection: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                payload = json.dumps(body) if body is not None else None
                self.connection.request(method, path, body=payload, headers=self.headers)
                response = self.connection.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.connection.close()
                    self.connection = None
                return response.status, json.loads(data) if data else None
            except (ConnectionError, http.client.HTTPException):
                if self.connection is not None:
                    self.connection.close()
                self.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _one(client: _Client, kind: str, fixtures: dict[str, Any], rng: random.Random, seq: str) -> int:
    if kind == "get_action":
        return client.request("GET", f"/api/v1/actions/{rng.choice(fixtures['action_ids'])}")[0]
    if kind == "list_actions":
        return client.request("GET", "/api/v1/actions?limit=20")[0]
    if kind == "replay_order":
        return client.request("POST", "/api/v1/orders", rng.choice(fixtures["orders"]))[0]
    if kind == "open_request":
        order = rng.choice(fixtures["orders"])["order_number"]
        return client.request(
            "POST", "/api/v1/refund-requests", {"order_number": order, "external_reference": f"L-{seq}"}
        )[0]
    return client.request("POST", "/api/v1/refunds", rng.choice(fixtures["proposals"]))[0]


def _load_process(base: str, fixtures: dict[str, Any], threads: int, deadline: float, index: int, out: Any) -> None:
    samples: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())

    def loop(thread: int) -> None:
        rng = random.Random(f"{index}-{thread}")
        client = _Client(base, fixtures["token"])
        local: list[tuple[str, int, float]] = []
        n = 0
        while time.time() < deadline:
            kind = rng.choices(kinds, weights)[0]
            started = time.perf_counter()
            try:
                status = _one(client, kind, fixtures, rng, f"{fixtures['run']}-{index}-{thread}-{n}")
            except (OSError, http.client.HTTPException):
                status = 0
            local.append((kind, status, time.perf_counter() - started))
            n += 1
        with lock:
            samples.extend(local)

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put(samples)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="A loopback address only.")
    parser.add_argument(
        "--duration", type=float, default=60.0, help=f"Seconds of load, at most {MAX_DURATION_SECONDS}."
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="Per process.")
    parser.add_argument("--orders", type=int, default=50)
    args = parser.parse_args(argv)
    host = urlsplit(args.url).hostname or ""
    if host not in LOOPBACK:
        parser.error(f"{host!r} is not a loopback address: this load run only targets this machine.")
    if not 0 < args.duration <= MAX_DURATION_SECONDS:
        parser.error(f"--duration must be between 0 and {MAX_DURATION_SECONDS} seconds.")

    print(f"set-up: {args.orders} orders, refund requests and proposals over the API ...", file=sys.stderr)
    fixtures = _setup(args.url, args.orders)
    print(
        f"load: {args.processes} x {args.threads} clients for {args.duration:g} s against {args.url}", file=sys.stderr
    )
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    started = time.time()
    deadline = started + args.duration
    processes = [
        context.Process(target=_load_process, args=(args.url, fixtures, args.threads, deadline, i, out))
        for i in range(args.processes)
    ]
    for process in processes:
        process.start()
    samples: list[tuple[str, int, float]] = []
    for _ in processes:
        samples.extend(out.get())
    for process in processes:
        process.join()
    elapsed = time.time() - started

    statuses = Counter(status for _, status, _ in samples)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for kind, _, seconds in samples:
        by_kind[kind].append(seconds)
    latencies = [seconds for _, _, seconds in samples]
    report = {
        "requests": len(samples),
        "seconds": round(elapsed, 1),
        "requests_per_second": round(len(samples) / elapsed, 1),
        "statuses": dict(sorted(statuses.items())),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 1),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies, default=0) * 1000, 1),
        "by_request": {
            kind: {
                "count": len(values),
                "p50_ms": round(statistics.median(values) * 1000, 1),
                "p99_ms": round(_percentile(values, 0.99) * 1000, 1),
            }
            for kind, values in sorted(by_kind.items())
        },
    }
    print(json.dumps(report, indent=2))
    failures = sum(count for status, count in statuses.items() if status == 0 or status >= 500)
    if statuses.get(429):
        print("429s were counted: run the server with API_RATE_LIMIT_PER_MINUTE=0", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
