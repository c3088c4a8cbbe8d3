"""Run the mail sandbox: ``python -m harness.sandboxes.mail [options]``.

Prints ``mail sandbox smtp=HOST:PORT control=URL`` once both listen; with ``--port-file`` it
writes ``{"smtp": PORT, "http": PORT}`` there, so a caller that asked for port 0 can find them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType

from harness.sandboxes.mail.sandbox import MailSandbox


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.sandboxes.mail", description="The mail sandbox.")
    parser.add_argument("--host", default=os.environ.get("MAIL_SANDBOX_HOST", "127.0.0.1"))
    parser.add_argument(
        "--smtp-port",
        type=int,
        default=int(os.environ.get("MAIL_SANDBOX_SMTP_PORT", "12525")),
        help="0 picks a free port (env MAIL_SANDBOX_SMTP_PORT, default 12525)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ.get("MAIL_SANDBOX_HTTP_PORT", "12580")),
        help="the control endpoint; 0 picks a free port (env MAIL_SANDBOX_HTTP_PORT, default 12580)",
    )
    parser.add_argument("--db", default=os.environ.get("MAIL_SANDBOX_DB", "mail-sandbox.sqlite3"))
    parser.add_argument("--port-file", default="")
    parser.add_argument("--fault-seed", type=int, default=0, help="seeds the faults' probabilities")
    args = parser.parse_args(argv)

    sandbox = MailSandbox(
        host=args.host, smtp_port=args.smtp_port, http_port=args.http_port, db_path=args.db, seed=args.fault_seed
    )
    sandbox.start()
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as handle:
            json.dump({"smtp": sandbox.smtp_port, "http": sandbox.http_port}, handle)
        os.replace(args.port_file + ".tmp", args.port_file)
    print(
        f"mail sandbox smtp={args.host}:{sandbox.smtp_port} control=http://{args.host}:{sandbox.http_port}", flush=True
    )

    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop.wait()
    sandbox.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
