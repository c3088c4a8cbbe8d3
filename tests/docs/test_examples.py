"""Every example in the README and the documentation site runs, against a live console.

The convention (written for authors in docs/index.md, "Examples in these pages"):

- A fenced block whose language is ``bash``, ``sh``, ``console`` or ``python`` is an example,
  and an example runs.
- An example that must not run (it starts a benchmark, restarts PostgreSQL, needs production
  secrets) is preceded, on the line just above its fence, by ``<!-- not-run: the reason -->``.
  The reason is required; ``test_every_example_not_run_says_why`` fails on an empty one and
  prints the list with its count.
- ``bash`` and ``sh`` blocks run one by one with ``bash -euo pipefail``; a ``console`` block runs
  its ``$ `` lines. ``python`` blocks of one page run in order in one interpreter, so a later
  block may use what an earlier one defined, as a reader reading down the page would.
- Examples are written for ``make start``'s machine: the console on 127.0.0.1:8000, the MCP
  server on 127.0.0.1:8001, the demo token in ``data/demo-agent-token.txt``, ``.venv/bin/python
  manage.py``. The test starts the same stack (the sandboxes, a Celery worker with beat, the web
  server, the MCP server, ``seed_demo``) on PostgreSQL and free ports, rewrites the two addresses,
  and runs the examples from a folder laid out like a checkout (``data/``, ``.venv``,
  ``manage.py``).

The stack has a database of its own (``DATABASE_TEST_NAME`` + ``_docs``), made afresh for each
run, so the examples meet exactly the demo data a reader meets after ``make start``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psycopg
import pytest
import redis
import requests

from tests.processes import REPO_ROOT, SandboxProcess, every_queue, wait_until

RUNNABLE = {"bash", "sh", "console", "python"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(?P<reason>.*?)-->\s*$")
EXAMPLE_TIMEOUT_SECONDS = 240
# The addresses the examples are written for (make start's), and the files that hold examples.
DOCS_WEB = "http://127.0.0.1:8000"
DOCS_MCP = "http://127.0.0.1:8001"


@dataclass(frozen=True)
class Example:
    path: str
    line: int
    language: str
    code: str
    not_run: str | None  # the reason, when the example is marked not to run

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def documentation_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def extract_examples(path: Path) -> list[Example]:
    """The fenced examples of one Markdown file, in order, with their not-run marks."""
    lines = path.read_text().splitlines()
    examples: list[Example] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        language = opening["info"].strip().split(" ")[0].lower() if opening["info"].strip() else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        if language in RUNNABLE:
            previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            mark = NOT_RUN.match(previous)
            examples.append(
                Example(
                    path=str(path.relative_to(REPO_ROOT)),
                    line=index + 1,
                    language=language,
                    code=textwrap.dedent("\n".join(body)) + "\n",
                    not_run=mark["reason"].strip() if mark else None,
                )
            )
        index = end + 1
    return examples


def all_examples() -> list[Example]:
    return [example for path in documentation_files() for example in extract_examples(path)]


def pages_with_runnable_examples() -> list[str]:
    return sorted({example.path for example in all_examples() if example.not_run is None})


# -- The extraction's own checks: no stack needed. -------------------------------------------


def test_every_example_not_run_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """A not-run mark without a reason hides an example from this test for nothing."""
    skipped = [example for example in all_examples() if example.not_run is not None]
    with capsys.disabled():
        sys.stdout.write(f"\n{len(skipped)} examples not run, each with its reason:\n")
        for example in skipped:
            sys.stdout.write(f"  {example.where} ({example.language}): {example.not_run}\n")
    assert [example.where for example in skipped if not example.not_run] == []


def test_the_examples_are_found(tmp_path: Path) -> None:
    """The extraction finds an indented block in a list, honours the mark just above a fence,
    and leaves other languages and bare fences alone."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```\nnot an example\n```\n\n```json\n{}\n```\n\n"
        "- a list item:\n\n  ```sh\n  echo one\n  ```\n\n"
        "<!-- not-run: restarts PostgreSQL -->\n```bash\necho two\n```\n\n"
        "```python\nprint(3)\n```\n"
    )
    page_in_repo = REPO_ROOT / "docs" / f"_extraction_check_{os.getpid()}.md"
    shutil.copy(page, page_in_repo)
    try:
        found = extract_examples(page_in_repo)
    finally:
        page_in_repo.unlink()
    assert [(e.language, e.code, e.not_run) for e in found] == [
        ("sh", "echo one\n", None),
        ("bash", "echo two\n", "restarts PostgreSQL"),
        ("python", "print(3)\n", None),
    ]


# -- The stack ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Stack:
    web: str
    mcp: str
    checkout: Path  # the examples' working folder, laid out like a checkout
    env: dict[str, str]
    logs: Path


def _database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    return base.rsplit("/", 1)[0] + f"/{name}"


def _fresh_database(name: str) -> None:
    with psycopg.connect(_database_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def _drop_database(name: str) -> None:
    with psycopg.connect(_database_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The console as ``make start`` runs it, on PostgreSQL and Redis, with the demo data."""
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
    if not broker.startswith("redis://") or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.fail("the examples' stack needs DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://...")
    name = os.environ.get("DATABASE_TEST_NAME", "test_console") + "_docs"
    root = tmp_path_factory.mktemp("docs-examples")
    checkout, logs = root / "checkout", root / "logs"
    data = checkout / "data"
    for folder in (data, logs):
        folder.mkdir(parents=True)
    # The examples say `.venv/bin/python manage.py ...`, as a reader in a checkout types it.
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (checkout / "manage.py").symlink_to(REPO_ROOT / "manage.py")

    redis.Redis.from_url(broker).flushdb()
    _fresh_database(name)
    processes: list[subprocess.Popen[bytes]] = []
    sandboxes = [
        SandboxProcess(_folder(root, "payment")),
        SandboxProcess(_folder(root, "accounting"), module="harness.sandboxes.accounting"),
    ]
    try:
        for sandbox in sandboxes:
            sandbox.start()
        smtp_port, mail_port = free_port(), free_port()
        web_port, mcp_port = free_port(), free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "DEBUG": "1",
            "CONSOLE_DATA_DIR": str(data),
            "DATABASE_URL": _database_url(name),
            "CELERY_BROKER_URL": broker,
            "PROVIDER_API_BASE": sandboxes[0].url,
            "ACCOUNTING_API_BASE": sandboxes[1].url,
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(smtp_port),
            "MAIL_SANDBOX_URL": f"http://127.0.0.1:{mail_port}",
            "CONSOLE_BASE_URL": f"http://127.0.0.1:{web_port}",
        }
        env.pop("CONSOLE_FAULT_POINTS", None)
        log = _log(logs, "mail")
        processes.append(
            _spawn(
                [sys.executable, "-m", "harness.sandboxes.mail", "--smtp-port", str(smtp_port),
                 "--http-port", str(mail_port), "--db", str(data / "mail-sandbox.sqlite3")],
                env, log,
            )
        )
        for command in (["migrate", "--noinput"], ["createcachetable"], ["seed_demo"]):
            subprocess.run(
                [sys.executable, "manage.py", *command], cwd=REPO_ROOT, env=env, check=True,
                stdout=_log(logs, "setup"), stderr=subprocess.STDOUT, timeout=300,
            )
        processes.append(
            _spawn(
                [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo",
                 "--queues", every_queue(), "--beat", "--schedule", str(data / "celerybeat-schedule"),
                 "--loglevel", "INFO",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                env, _log(logs, "worker"),
            )
        )
        processes.append(
            _spawn([sys.executable, "manage.py", "mcp_serve", "--port", str(mcp_port)], env, _log(logs, "mcp"))
        )
        processes.append(
            _spawn(
                [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{web_port}"],
                env, _log(logs, "web"),
            )
        )
        web, mcp = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{mcp_port}"
        wait_until(lambda: _answers(f"{web}/readyz"), timeout=60, what="the web server's /readyz")
        wait_until(lambda: _answers(f"{mcp}/mcp", any_status=True), timeout=60, what="the MCP server")
        wait_until(lambda: "ready" in (logs / "worker.log").read_text(), timeout=60, what="the worker")
        yield Stack(web=web, mcp=mcp, checkout=checkout, env=env, logs=logs)
    finally:
        for process in processes:
            _stop(process)
        for sandbox in sandboxes:
            sandbox.stop()
        redis.Redis.from_url(broker).flushdb()
        _drop_database(name)


def _folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    return folder


def _log(logs: Path, name: str) -> IO[bytes]:
    # Left open: the child process writes to it until the stack stops.
    return open(logs / f"{name}.log", "ab")


def _spawn(command: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    # A session of its own, so that stopping it also stops the worker's embedded beat.
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)


def _answers(url: str, any_status: bool = False) -> bool:
    try:
        status = requests.get(url, timeout=2).status_code
    except requests.ConnectionError:
        return False
    return any_status or status == 200


# -- Running the examples ----------------------------------------------------------------------

PYTHON_RUNNER = r"""
import json, sys, traceback
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["where"], "exec"), namespace)
        outcome = {"ok": True}
    except BaseException:
        outcome = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.flush()
    sys.stderr.flush()
    sys.__stdout__.write("\n@@EXAMPLE-DONE@@ " + json.dumps(outcome) + "\n")
    sys.__stdout__.flush()
"""


class PythonSession:
    """One interpreter per page: each block runs in the namespace the blocks above it left."""

    def __init__(self, stack: Stack) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", PYTHON_RUNNER], cwd=stack.checkout, env=stack.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def run(self, example: Example, code: str) -> tuple[bool, str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"code": code, "where": example.where}) + "\n")
        self.process.stdin.flush()
        output: list[str] = []
        # A block that hangs is killed at the deadline; the loop below then sees the end.
        watchdog = threading.Timer(EXAMPLE_TIMEOUT_SECONDS, self.process.kill)
        watchdog.start()
        try:
            for line in self.process.stdout:  # the runner answers every block, or dies
                if line.startswith("@@EXAMPLE-DONE@@ "):
                    outcome = json.loads(line.split(" ", 1)[1])
                    return outcome["ok"], "".join(output) + outcome.get("error", "")
                output.append(line)
        finally:
            watchdog.cancel()
        return False, "".join(output) + f"\n(the interpreter ended, or the block ran past {EXAMPLE_TIMEOUT_SECONDS}s)"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _for_the_stack(code: str, stack: Stack) -> str:
    return code.replace(DOCS_WEB, stack.web).replace(DOCS_MCP, stack.mcp)


def _shell_script(example: Example) -> str:
    if example.language != "console":
        return example.code
    return "".join(line[2:] + "\n" for line in example.code.splitlines() if line.startswith("$ "))


def _run_shell(example: Example, code: str, stack: Stack) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], cwd=stack.checkout, env=stack.env,
            capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as timeout:
        # What the example printed before the deadline; Python hands it over as bytes here.
        printed = b"".join(
            part if isinstance(part, bytes) else (part or "").encode() for part in (timeout.stdout, timeout.stderr)
        )
        return False, f"timed out after {EXAMPLE_TIMEOUT_SECONDS}s\n{printed.decode(errors='replace')}"
    return done.returncode == 0, f"exit {done.returncode}\n{done.stdout}{done.stderr}"


@pytest.mark.processes
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_runnable_examples())
def test_the_examples_of_a_page_run(page: str, stack: Stack) -> None:
    """Each example of the page runs to success, in the page's order."""
    examples = [example for example in extract_examples(REPO_ROOT / page) if example.not_run is None]
    python: PythonSession | None = None
    try:
        for example in examples:
            if example.language == "python":
                python = python or PythonSession(stack)
                ok, output = python.run(example, _for_the_stack(example.code, stack))
            else:
                ok, output = _run_shell(example, _for_the_stack(_shell_script(example), stack), stack)
            if not ok:
                pytest.fail(
                    f"the example at {example.where} failed:\n{example.code}\n--- its output ---\n{output}\n"
                    f"--- the web server's log, last lines ---\n{_tail(stack.logs / 'web.log')}"
                )
    finally:
        if python is not None:
            python.close()


def _tail(path: Path, size: int = 2000) -> str:
    return path.read_text(errors="replace")[-size:] if path.exists() else ""
