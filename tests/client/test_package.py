"""console_client as a package: its wheel, installed into a fresh virtual environment that holds
nothing but the wheel and its declared dependency, calls the live API over real HTTP.

The environment is built offline: the wheel is installed with --no-index, and ``requests`` with
the packages it needs is made visible from this test run's own environment through a directory
that holds only them (a .pth file), so that neither the repository nor Django can be imported
there by accident.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import console_client
from actions.agents.services import agent_token_issue
from actions.api.versions import current_version, version_known
from actions.models import Agent, RefundRequest
from tests.factories import make_order

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "console_client"
# The distributions ``requests`` imports at run time, by their import names.
RUNTIME_DEPENDENCIES = ("requests", "urllib3", "idna", "charset_normalizer", "certifi")

CALL = """
import json, sys
import console_client
from console_client import BadInput, ConsoleClient

base, token = sys.argv[1], sys.argv[2]
with ConsoleClient(base, token) as console:
    opened = console.open_refund_request(order_number="4821", external_reference="ZD-WHEEL", reason_code="damaged")
    again = console.open_refund_request(order_number="4821", external_reference="ZD-WHEEL", reason_code="damaged")
    try:
        console.propose_refund(order_number="4821", request_number=opened.request_number, amount="-1",
                               currency="EUR", reason_code="damaged")
        refused = None
    except BadInput as error:
        refused = [e.field for e in error.errors]
print(json.dumps({"file": console_client.__file__, "version": console_client.__version__,
                  "request": opened.request_number, "again": again.request_number, "refused": refused}))
"""


def _run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the build backend (hatchling, requirements-dev.txt) is already here;
    # isolation would download it.
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, PACKAGE)
    (built,) = out.glob("console_client-*.whl")
    return built


@pytest.fixture(scope="module")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("venv")
    venv = base / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    deps = base / "deps"
    deps.mkdir()
    for name in RUNTIME_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        (deps / name).symlink_to(Path(next(iter(spec.submodule_search_locations))))
    (site / "runtime-dependencies.pth").write_text(f"{deps}\n")
    # This environment's pip installs into the new one (which has none of its own).
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", wheel)
    return python


def test_the_wheel_holds_the_package_its_type_marker_and_its_one_dependency(wheel: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read("console_client-1.0.0.dist-info/METADATA").decode()
    assert {f"console_client/{m}" for m in ("__init__.py", "client.py", "py.typed")} <= names
    assert not any(name.startswith(("tests/", "actions/")) or name.endswith("pyproject.toml") for name in names)
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == [
        "Requires-Dist: requests<3,>=2.31"
    ]


def test_the_package_version_and_the_api_version_it_speaks_agree_with_the_console() -> None:
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert project["version"] == console_client.__version__ == "1.0.0"
    assert version_known(console_client.API_VERSION)
    assert current_version() == console_client.API_VERSION, "a new API version needs a client release"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_installed_wheel_talks_to_the_live_api(venv_python: Path, live_server: Any, agent: Agent) -> None:
    order = make_order(number="4821", currency="EUR", captured="100.00")
    token = agent_token_issue(agent=agent, label="wheel").plain
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONNOUSERSITE": "1"}

    result = _run(venv_python, "-c", CALL, live_server.url, token, env=env, cwd=venv_python.parent)

    answer = json.loads(result.stdout)
    assert answer["file"].startswith(str(venv_python.parent.parent)), "imported from the wheel, not the checkout"
    assert answer["version"] == "1.0.0"
    assert answer["request"] == answer["again"] == RefundRequest.objects.get(order=order).number
    assert answer["refused"] == ["amount"]


@pytest.mark.slow
def test_the_installed_package_type_checks_under_mypy_strict(venv_python: Path, tmp_path: Path) -> None:
    """The py.typed marker ships, so an agent's mypy reads the client's hints."""
    snippet = tmp_path / "agent.py"
    snippet.write_text(
        "from console_client import Action, ConsoleClient\n"
        "def latest(console: ConsoleClient, action_id: str) -> Action:\n"
        "    return console.get_action(action_id)\n"
        "def wrong(console: ConsoleClient) -> int:\n"
        "    return console.get_action('x')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(venv_python),
         str(snippet)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    # Exactly the one planted error: the hints were read (without py.typed the import itself
    # would be the error, and the planted one would go unseen).
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "Incompatible return value type" in errors[0], result.stdout


@pytest.mark.slow
def test_the_package_source_passes_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PACKAGE / "pyproject.toml"), "--no-incremental", "."],
        capture_output=True, text=True, timeout=300, cwd=PACKAGE,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
