"""Run the accounting sandbox: ``python -m harness.sandboxes.accounting [options]``.

Options can also come from the environment (see ``--help``). It prints ``accounting sandbox
listening on URL`` once it accepts connections and, with ``--port-file``, writes the port there.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from harness.sandboxes.accounting.sandbox import AccountingConfig
from harness.sandboxes.accounting.server import make_server


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    defaults = AccountingConfig()
    parser = argparse.ArgumentParser(
        prog="python -m harness.sandboxes.accounting",
        description="A Xero-compatible accounting API (supplier bills, credit notes) with fault injection.",
    )
    parser.add_argument("--host", default=os.environ.get("ACCOUNTING_SANDBOX_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("ACCOUNTING_SANDBOX_PORT", "12112")))
    parser.add_argument("--db", default=os.environ.get("ACCOUNTING_SANDBOX_DB", "accounting-sandbox.sqlite3"))
    parser.add_argument(
        "--key-retention-seconds",
        type=float,
        default=_env_float("ACCOUNTING_SANDBOX_KEY_RETENTION_SECONDS", defaults.key_retention_seconds),
    )
    parser.add_argument(
        "--lookup-visibility-delay-seconds",
        type=float,
        default=_env_float(
            "ACCOUNTING_SANDBOX_LOOKUP_VISIBILITY_DELAY_SECONDS", defaults.lookup_visibility_delay_seconds
        ),
    )
    parser.add_argument("--fault-seed", type=int, default=None)
    parser.add_argument("--port-file", default=os.environ.get("ACCOUNTING_SANDBOX_PORT_FILE"))
    parser.add_argument("--verbose", action="store_true")
    return parser


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = AccountingConfig()
    try:
        config.update(
            {
                "key_retention_seconds": args.key_retention_seconds,
                "lookup_visibility_delay_seconds": args.lookup_visibility_delay_seconds,
            }
        )
    except ValueError as exc:
        print(f"accounting sandbox: {exc}", file=sys.stderr)
        return 2
    server = make_server(args.host, args.port, args.db, config, fault_seed=args.fault_seed, verbose=args.verbose)
    signal.signal(signal.SIGTERM, _stop)
    if args.port_file:
        tmp = f"{args.port_file}.tmp"
        with open(tmp, "w") as fh:
            fh.write(str(server.server_address[1]))
        os.replace(tmp, args.port_file)
    print(f"accounting sandbox listening on {server.url} (db {args.db})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
