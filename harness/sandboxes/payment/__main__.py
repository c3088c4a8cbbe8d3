"""Run the sandbox provider: ``python -m harness.sandboxes.payment [options]``.

Every option can also come from the environment (shown in ``--help``); a flag wins over its
variable. The process prints ``sandbox listening on URL`` once it accepts connections and, with
``--port-file``, writes the port there, so a caller that asked for port 0 can find it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from harness.sandboxes.payment.app import SandboxConfig
from harness.sandboxes.payment.server import make_server
from harness.sandboxes.payment.webhooks import WebhookEndpoint


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    defaults = SandboxConfig()
    parser = argparse.ArgumentParser(
        prog="python -m harness.sandboxes.payment",
        description="A Stripe-compatible refund provider with fault injection.",
    )
    parser.add_argument(
        "--host", default=os.environ.get("SANDBOX_HOST", "127.0.0.1"), help="env SANDBOX_HOST"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=_env_int("SANDBOX_PORT", 12111),
        help="0 picks a free port (env SANDBOX_PORT, default 12111)",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("SANDBOX_DB", "sandbox.sqlite3"),
        help="SQLite file for the sandbox's own ledger (env SANDBOX_DB)",
    )
    parser.add_argument(
        "--key-retention-seconds",
        type=float,
        default=_env_float("SANDBOX_KEY_RETENTION_SECONDS", defaults.key_retention_seconds),
        help="how long idempotency keys are remembered (env SANDBOX_KEY_RETENTION_SECONDS)",
    )
    parser.add_argument(
        "--lookup-visibility-delay-seconds",
        type=float,
        default=_env_float(
            "SANDBOX_LOOKUP_VISIBILITY_DELAY_SECONDS", defaults.lookup_visibility_delay_seconds
        ),
        help="how long a new refund stays out of list results "
        "(env SANDBOX_LOOKUP_VISIBILITY_DELAY_SECONDS)",
    )
    parser.add_argument(
        "--pending-settle-after-seconds",
        type=float,
        default=_env_float(
            "SANDBOX_PENDING_SETTLE_AFTER_SECONDS", defaults.pending_settle_after_seconds
        ),
        help="when pending refunds settle (env SANDBOX_PENDING_SETTLE_AFTER_SECONDS)",
    )
    parser.add_argument(
        "--pending-outcome",
        choices=("succeeded", "failed"),
        default=os.environ.get("SANDBOX_PENDING_OUTCOME", defaults.pending_outcome),
        help="how pending refunds settle (env SANDBOX_PENDING_OUTCOME)",
    )
    parser.add_argument(
        "--webhook-url",
        default=os.environ.get("SANDBOX_WEBHOOK_URL", ""),
        help="where to send signed webhook events, e.g. http://127.0.0.1:8000/webhooks/stripe "
        "(env SANDBOX_WEBHOOK_URL; none by default)",
    )
    parser.add_argument(
        "--webhook-secret",
        default=os.environ.get("SANDBOX_WEBHOOK_SECRET", "whsec_sandbox"),
        help="the endpoint's signing secret (env SANDBOX_WEBHOOK_SECRET; the console's default)",
    )
    parser.add_argument(
        "--fault-seed",
        type=int,
        default=_env_int("SANDBOX_FAULT_SEED", None),
        help="seed for probabilistic faults, for reproducible runs (env SANDBOX_FAULT_SEED)",
    )
    parser.add_argument(
        "--port-file", default=os.environ.get("SANDBOX_PORT_FILE"), help="env SANDBOX_PORT_FILE"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=os.environ.get("SANDBOX_VERBOSE", "") not in ("", "0"),
        help="log every request to stderr (env SANDBOX_VERBOSE=1)",
    )
    return parser


def _stop(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into a normal exit so serve_forever unwinds and the database is closed.
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = SandboxConfig()
    try:
        config.update(
            {
                "key_retention_seconds": args.key_retention_seconds,
                "lookup_visibility_delay_seconds": args.lookup_visibility_delay_seconds,
                "pending_settle_after_seconds": args.pending_settle_after_seconds,
                "pending_outcome": args.pending_outcome,
            }
        )
    except ValueError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 2
    server = make_server(
        args.host,
        args.port,
        args.db,
        config,
        fault_seed=args.fault_seed,
        verbose=args.verbose,
        webhook=WebhookEndpoint(url=args.webhook_url, secret=args.webhook_secret),
    )
    signal.signal(signal.SIGTERM, _stop)
    if args.port_file:
        # Written to a temporary name and renamed, so a reader never sees a half-written port.
        tmp = f"{args.port_file}.tmp"
        with open(tmp, "w") as fh:
            fh.write(str(server.server_address[1]))
        os.replace(tmp, args.port_file)
    print(f"sandbox listening on {server.url} (db {args.db})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
