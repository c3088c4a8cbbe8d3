"""The mail sandbox: an SMTP server on aiosmtpd with its own storage and fault injection.

It keeps every message it accepted (SQLite, its own file) and lists them on an HTTP control
endpoint, as JSON (``/messages``) and as an inbox a person reads (``/``, ``/messages/<id>``).
That list is the receiver's ledger for the tests and the audit: the console can never ask a
real supplier's mailbox, but it can ask this one, which is how the tests prove that a message
went out at most once.

Fault modes (set over HTTP, each for ``count`` messages or until cleared, optionally only for
one recipient):

- ``defer``: 451 to RCPT TO, before DATA: definitely not sent;
- ``reject``: 550 to RCPT TO: refused for good;
- ``reject_data``: 554 after the content, nothing stored: refused for good;
- ``drop_after_data``: store the message, then drop the connection before the final reply;
- ``slow``: wait ``sleep_seconds`` before the final reply to DATA (the message is stored first,
  so a client that gives up early has, in fact, handed it over).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import random
import re
import socket
import sqlite3
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from aiosmtpd.controller import Controller

# aiosmtpd logs every command at INFO: the stored messages are the record here.
logging.getLogger("mail.log").setLevel(logging.WARNING)

FAULT_MODES = ("defer", "reject", "reject_data", "drop_after_data", "slow")


@dataclass
class Fault:
    mode: str
    rcpt: str = ""  # only for this recipient; empty: every message
    count: int | None = None  # how many messages it applies to; None: until cleared
    sleep_seconds: float = 0.0
    probability: float = 1.0  # the chance it fires for a message (seeded: a run can be repeated)


class MailStore:
    """The sandbox's own ledger: every message it accepted, never edited."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, message_id TEXT, action_id TEXT, "
            "mail_from TEXT, rcpt_to TEXT, subject TEXT, possible_repeat TEXT, body TEXT, raw TEXT, "
            "received_at TEXT)"
        )

    def add(self, *, mail_from: str, rcpt_to: list[str], content: bytes) -> dict[str, Any]:
        parsed = message_from_bytes(content, policy=policy.default)
        body_part = parsed.get_body(preferencelist=("plain",))
        body = body_part.get_content() if body_part is not None else ""  # type: ignore[attr-defined]
        # SMTP carries lines ending in CRLF; a mail client shows them as lines, and so does this.
        body = body.replace("\r\n", "\n")
        row = {
            "message_id": str(parsed.get("Message-ID", "")).strip(),
            "action_id": str(parsed.get("X-Console-Action-Id", "")).strip(),
            "mail_from": mail_from,
            "rcpt_to": ",".join(rcpt_to),
            "subject": str(parsed.get("Subject", "")),
            "possible_repeat": str(parsed.get("X-Console-Possible-Repeat", "")),
            "body": body,
            "raw": content.decode("utf-8", errors="replace"),
            "received_at": datetime.now(UTC).isoformat(),
        }
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO messages (message_id, action_id, mail_from, rcpt_to, subject, possible_repeat, body, "
                "raw, received_at) VALUES (:message_id, :action_id, :mail_from, :rcpt_to, :subject, "
                ":possible_repeat, :body, :raw, :received_at)",
                row,
            )
        return {"id": cursor.lastrowid, **row}

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            cursor = self._db.execute(
                "SELECT id, message_id, action_id, mail_from, rcpt_to, subject, possible_repeat, body, received_at "
                "FROM messages ORDER BY id"
            )
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

    def one(self, pk: int) -> dict[str, Any] | None:
        with self._lock:
            cursor = self._db.execute(
                "SELECT id, message_id, action_id, mail_from, rcpt_to, subject, possible_repeat, body, raw, "
                "received_at FROM messages WHERE id = ?",
                (pk,),
            )
            names = [column[0] for column in cursor.description]
            row = cursor.fetchone()
            return dict(zip(names, row, strict=True)) if row is not None else None

    def clear(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM messages")


class Faults:
    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._random = random.Random(seed)
        self.fired: dict[str, int] = {}

    def add(self, fault: Fault) -> None:
        if fault.mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {fault.mode!r}; use one of {', '.join(FAULT_MODES)}")
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(fault) for fault in self._faults]

    def take(self, *, modes: tuple[str, ...], rcpt: str) -> Fault | None:
        """The first live fault of one of ``modes`` for ``rcpt``, using up one of its count."""
        with self._lock:
            for fault in self._faults:
                if fault.mode in modes and (not fault.rcpt or fault.rcpt.lower() == rcpt.lower()):
                    if fault.probability < 1.0 and self._random.random() >= fault.probability:
                        continue
                    self.fired[fault.mode] = self.fired.get(fault.mode, 0) + 1
                    if fault.count is not None:
                        fault.count -= 1
                        if fault.count <= 0:
                            self._faults.remove(fault)
                    return fault
        return None


class SandboxHandler:
    def __init__(self, store: MailStore, faults: Faults) -> None:
        self.store = store
        self.faults = faults

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]) -> str:
        fault = self.faults.take(modes=("defer", "reject"), rcpt=address)
        if fault is not None and fault.mode == "defer":
            return "451 4.3.0 Sandbox: try again later"
        if fault is not None:
            return "550 5.1.1 Sandbox: mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        rcpt = envelope.rcpt_tos[0] if envelope.rcpt_tos else ""
        fault = self.faults.take(modes=("reject_data", "drop_after_data", "slow"), rcpt=rcpt)
        if fault is not None and fault.mode == "reject_data":
            return "554 5.6.0 Sandbox: message refused"
        content = envelope.original_content or envelope.content
        self.store.add(mail_from=envelope.mail_from, rcpt_to=list(envelope.rcpt_tos), content=content)
        if fault is not None and fault.mode == "drop_after_data":
            # Stored, then the connection goes before the 250: the client cannot know.
            server.transport.abort()
            return "250 OK"
        if fault is not None and fault.mode == "slow":
            await asyncio.sleep(fault.sleep_seconds)
        return "250 OK"


def control_server(host: str, port: int, store: MailStore, faults: Faults) -> ThreadingHTTPServer:
    """The HTTP control endpoint: GET /health, GET /messages, GET|POST|DELETE /faults, POST /reset;
    and the inbox's pages (``inbox_page``)."""

    class Control(BaseHTTPRequestHandler):
        def _reply(self, status: int, data: Any) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _page(self, status: int, html_text: str, content_type: str = "text/html; charset=utf-8") -> None:
            body = html_text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            # Nothing on these pages runs a script: a message's HTML is shown in a sandboxed frame.
            self.send_header("Content-Security-Policy", INBOX_CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            page = inbox_page(store, self.path)
            if page is not None:
                self._page(*page)
            elif self.path == "/health":
                self._reply(200, {"ok": True})
            elif self.path == "/messages":
                self._reply(200, {"messages": store.all()})
            elif self.path == "/faults":
                self._reply(200, {"faults": faults.list(), "fired": dict(faults.fired)})
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                data = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._reply(400, {"error": "send JSON"})
                return
            if self.path == "/faults":
                try:
                    faults.add(
                        Fault(
                            mode=str(data.get("mode", "")),
                            rcpt=str(data.get("rcpt", "")),
                            count=int(data["count"]) if data.get("count") is not None else None,
                            sleep_seconds=float(data.get("sleep_seconds", 0)),
                            probability=float(data.get("probability", 1.0)),
                        )
                    )
                except (TypeError, ValueError) as error:
                    self._reply(400, {"error": str(error)})
                    return
                self._reply(201, {"faults": faults.list()})
            elif self.path == "/reset":
                store.clear()
                faults.clear()
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": "not found"})

        def do_DELETE(self) -> None:
            if self.path == "/faults":
                faults.clear()
                self._reply(200, {"faults": []})
            else:
                self._reply(404, {"error": "not found"})

    return ThreadingHTTPServer((host, port), Control)


# --- the inbox: a page a person reads, besides the JSON list -----------------------------------

INBOX_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; frame-src 'self'; img-src data:; form-action 'none'; "
    "frame-ancestors 'self'"
)
_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0;color:#1f2933;background:#f5f7fa}"
    "header{background:#243b53;color:#fff;padding:.8rem 1.5rem}header a{color:#fff}"
    "main{max-width:1000px;margin:0 auto;padding:1.5rem}"
    "table{width:100%;border-collapse:collapse;background:#fff}"
    "th,td{text-align:left;padding:.5rem .7rem;border-bottom:1px solid #d9e2ec;vertical-align:top}"
    "td a{color:#1f57a8}pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#fff;padding:1rem;"
    "border:1px solid #d9e2ec}dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem}"
    "dt{font-weight:600}dd{margin:0;overflow-wrap:anywhere}iframe{width:100%;height:420px;border:1px solid #d9e2ec;"
    "background:#fff}.muted{color:#52606d}"
)
_URL = re.compile(r"https?://[^\s<>\"']+")


def _linkify(text: str) -> str:
    """Escape the text, then make its http(s) addresses links (each escaped as an attribute)."""
    out: list[str] = []
    last = 0
    for found in _URL.finditer(text):
        out.append(html.escape(text[last : found.start()]))
        url = found.group(0)
        out.append(f'<a href="{html.escape(url, quote=True)}">{html.escape(url)}</a>')
        last = found.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _layout(title: str, content: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} · Mail sandbox'
        f'</title><meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style>'
        f'</head><body><header><a href="/">Mail sandbox</a> · every message it accepted'
        f' (<a href="/messages">JSON</a>)</header><main>{content}</main></body></html>'
    )


def _html_part(raw: str) -> str | None:
    parsed = message_from_bytes(raw.encode("utf-8", errors="replace"), policy=policy.default)
    part = parsed.get_body(preferencelist=("html",))
    if part is None or part.get_content_type() != "text/html":
        return None
    return str(part.get_content())  # type: ignore[attr-defined]


def inbox_page(store: MailStore, path: str) -> tuple[int, str] | tuple[int, str, str] | None:
    """The inbox's pages: ``/`` (the list), ``/messages/<id>`` (one message), its HTML part alone
    (``/messages/<id>/html``, shown in a sandboxed frame) and its raw source; None for other paths."""
    route = urlsplit(path).path
    if route in ("/", "/inbox"):
        rows = "".join(
            f"<tr><td>{html.escape(row['received_at'][:19].replace('T', ' '))}</td>"
            f"<td>{html.escape(row['mail_from'])}</td><td>{html.escape(row['rcpt_to'])}</td>"
            f'<td><a href="/messages/{int(row["id"])}">{html.escape(row["subject"] or "(no subject)")}</a></td></tr>'
            for row in reversed(store.all())
        )
        table = (
            "<table><thead><tr><th>Received (UTC)</th><th>From</th><th>To</th><th>Subject</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if rows
            else '<p class="muted">No messages yet.</p>'
        )
        return 200, _layout("Inbox", f"<h1>Inbox</h1>{table}")
    found = re.fullmatch(r"/messages/(\d+)(/html|/raw)?", route)
    if found is None:
        return None
    row = store.one(int(found.group(1)))
    if row is None:
        return 404, _layout("Not found", '<h1>No such message</h1><p><a href="/">Back to the inbox</a></p>')
    if found.group(2) == "/raw":
        return 200, str(row["raw"]), "text/plain; charset=utf-8"
    html_part = _html_part(str(row["raw"]))
    if found.group(2) == "/html":
        if html_part is None:
            return 404, _layout("Not found", "<h1>This message has no HTML part</h1>")
        # The message's own HTML, as sent; the page's policy lets no script in it run. Its links
        # open in a new tab (the frame is sandboxed, and may not navigate to another origin).
        return 200, '<base target="_blank">' + html_part
    pk = int(row["id"])
    fields = [
        ("From", row["mail_from"]),
        ("To", row["rcpt_to"]),
        ("Subject", row["subject"]),
        ("Received", row["received_at"]),
        ("Message-ID", row["message_id"]),
    ]
    if row["action_id"]:
        fields.append(("Action", row["action_id"]))
    if row["possible_repeat"]:
        fields.append(("Possible repeat", row["possible_repeat"]))
    head = "".join(f"<dt>{html.escape(name)}</dt><dd>{html.escape(str(value))}</dd>" for name, value in fields)
    frame = (
        f'<h2>HTML</h2><iframe sandbox="allow-popups allow-popups-to-escape-sandbox" title="The message as HTML" '
        f'src="/messages/{pk}/html"></iframe>'
        if html_part is not None
        else ""
    )
    content = (
        f'<p><a href="/">Back to the inbox</a> · <a href="/messages/{pk}/raw">Source</a></p>'
        f"<h1>{html.escape(row['subject'] or '(no subject)')}</h1><dl>{head}</dl>"
        f"<h2>Text</h2><pre>{_linkify(str(row['body']))}</pre>{frame}"
    )
    return 200, _layout(str(row["subject"] or "Message"), content)


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class MailSandbox:
    """The SMTP server and its control endpoint, in this process's threads."""

    def __init__(self, *, host: str, smtp_port: int, http_port: int, db_path: str, seed: int = 0) -> None:
        self.host = host
        self.store = MailStore(db_path)
        self.faults = Faults(seed)
        self.smtp_port = smtp_port or free_port(host)
        self.controller = Controller(
            SandboxHandler(self.store, self.faults), hostname=host, port=self.smtp_port, ready_timeout=10
        )
        self.http = control_server(host, http_port, self.store, self.faults)
        self.http_port = int(self.http.server_address[1])
        self._http_thread = threading.Thread(target=self.http.serve_forever, name="mail-control", daemon=True)

    def start(self) -> None:
        self.controller.start()
        self._http_thread.start()

    def stop(self) -> None:
        self.http.shutdown()
        self.controller.stop()
