"""Gunicorn's access log as one JSON object per line.

Gunicorn's own ``access_log_format`` is a %-template: a quote in a path or a user agent would
break a JSON template, so the line is built with ``json.dumps`` from gunicorn's atoms instead.
The fields match the API's own log lines (``actions.api.logs``) where they overlap, and the
request id is the one the API answered with, so an access line and the API's lines of the same
request are found with one grep.
"""

from __future__ import annotations

import json
import traceback
from datetime import UTC, datetime
from typing import Any

from gunicorn.glogging import Logger


class JsonAccessLogger(Logger):  # type: ignore[misc]
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if not self.access_log_enabled:
            return
        try:
            atoms = self.atoms(resp, req, environ, request_time)
            self.access_log.info(json.dumps(access_record(atoms), ensure_ascii=False))
        except Exception:
            self.error(traceback.format_exc())


def access_record(atoms: dict[str, Any]) -> dict[str, Any]:
    """The fields of one access line, from gunicorn's atoms (see ``Logger.atoms``)."""
    status = atoms.get("s")
    return {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "event": "http.access",
        "remote_addr": atoms.get("h"),
        "method": atoms.get("m"),
        "path": atoms.get("U"),
        "query": atoms.get("q") or None,
        "status": int(str(status)) if str(status).isdigit() else status,
        "bytes": atoms.get("B"),
        "duration_ms": round(int(atoms.get("D") or 0) / 1000, 1),
        "request_id": atoms.get("{x-request-id}o") or None,
        "user_agent": atoms.get("a"),
        "pid": atoms.get("p"),
    }
