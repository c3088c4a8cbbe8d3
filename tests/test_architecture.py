"""The shape of the app code, measured: each number may only go down.

Run it alone to print the table (``pytest tests/test_architecture.py -s``). ``CEILINGS`` holds
the highest value each measure may have; a change that raises one fails here, and a change
that lowers one should lower its ceiling in the same commit, so that it stays lowered.

App code is ``actions``, ``approvals`` and ``console``, without migrations; the harness
(``harness/``) and the tests are tools around it and are not measured.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
APP_PACKAGES = ("actions", "approvals", "console")
LONG_MODULE_LINES = 600
LONG_FUNCTION_LINES = 80
# Data tables, not logic: a long module here is a list of rows, named on purpose.
LONG_MODULE_EXCEPTIONS: frozenset[str] = frozenset()

CEILINGS = {
    "modules over 600 lines": 0,
    "functions over 80 lines": 0,
    "modules loose at the top of actions/": 9,
    "app modules in no import-linter layer": 0,
    "private names imported across modules": 0,
    "kind branches outside actions/kinds": 0,
    "reaches into Django's internals": 0,
    "harness modules inside the app": 0,
}

# Pairs of places in the app sharing six or more lines of the same shape, as the `duplicates`
# command counts them (installed on the developers' machines and in CI). Kept apart from
# CEILINGS because it runs a command rather than reading the tree here.
DUPLICATE_PAIRS_CEILING = 57
DUPLICATES_SECONDS = 60
# The command lists at most 200 rows; a package with more would hide some, so the count fails
# loudly rather than count short.
DUPLICATES_MOST = 200
DUPLICATE_ROW = re.compile(r"^D\d+ (?P<left>\S+):\d+-\d+ ~ (?P<right>\S+):\d+-\d+")


def app_modules() -> Iterator[tuple[str, Path]]:
    for package in APP_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT)
            if "migrations" in relative.parts or "scripts" in relative.parts:
                continue
            dotted = ".".join(relative.with_suffix("").parts)
            yield dotted.removesuffix(".__init__"), path


@dataclass
class Shape:
    long_modules: list[str] = field(default_factory=list)
    long_functions: list[str] = field(default_factory=list)
    loose_in_actions: list[str] = field(default_factory=list)
    unlayered: list[str] = field(default_factory=list)
    private_imports: list[str] = field(default_factory=list)
    kind_branches: list[str] = field(default_factory=list)
    internals: list[str] = field(default_factory=list)
    harness_inside: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "modules over 600 lines": len(self.long_modules),
            "functions over 80 lines": len(self.long_functions),
            "modules loose at the top of actions/": len(self.loose_in_actions),
            "app modules in no import-linter layer": len(self.unlayered),
            "private names imported across modules": len(self.private_imports),
            "kind branches outside actions/kinds": len(self.kind_branches),
            "reaches into Django's internals": len(self.internals),
            "harness modules inside the app": len(self.harness_inside),
        }


def _layer_modules() -> list[str]:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    named: list[str] = []
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract.get("type") == "layers":
            for layer in contract["layers"]:
                named.extend(part.strip() for part in layer.split(":"))
    return named


def _in_a_layer(module: str, layers: list[str]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def _is_kind_test(node: ast.Compare) -> bool:
    """``kind == "refund"``, ``action.kind != ...``, ``kind in ("a", "b")``: a branch on a kind's
    name against literal names."""

    def names_kind(expression: ast.expr) -> bool:
        if isinstance(expression, ast.Name):
            return expression.id in ("kind", "kind_name", "action_kind")
        if isinstance(expression, ast.Attribute):
            return expression.attr in ("kind", "action_kind")
        return False

    def literal_kinds(expression: ast.expr) -> bool:
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            return True
        if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name):
            return expression.value.id == "ActionKind"
        if isinstance(expression, (ast.Tuple, ast.List, ast.Set)):
            return bool(expression.elts) and all(literal_kinds(item) for item in expression.elts)
        return False

    if not names_kind(node.left):
        return False
    return any(
        isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and literal_kinds(right)
        for op, right in zip(node.ops, node.comparators, strict=True)
    )


INTERNALS = re.compile(r"django\.db\.models\.sql|_do_update|klass_info|annotation_col_map|_iterable_class|__dict__")
HARNESS_NAMES = re.compile(r"(^|\.)(chaos|chaos_\w+|sandbox|demo_\w+|seed_demo)$")


def measure() -> Shape:
    shape = Shape()
    layers = _layer_modules()
    for module, path in app_modules():
        text = path.read_text()
        lines = text.count("\n") + 1
        if lines > LONG_MODULE_LINES and module not in LONG_MODULE_EXCEPTIONS:
            shape.long_modules.append(f"{module} ({lines})")
        parts = module.split(".")
        if parts[0] == "actions" and len(parts) == 2 and path.name != "__init__.py":
            shape.loose_in_actions.append(module)
        entry_point = parts[-1] in ("apps", "settings", "wsgi", "celery")
        if "." in module and path.name != "__init__.py" and not entry_point and not _in_a_layer(module, layers):
            shape.unlayered.append(module)
        if HARNESS_NAMES.search(module):
            shape.harness_inside.append(module)
        for number, line in enumerate(text.splitlines(), 1):
            if INTERNALS.search(line) and not line.lstrip().startswith("#"):
                shape.internals.append(f"{module}:{number}")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > LONG_FUNCTION_LINES:
                    shape.long_functions.append(f"{module}.{node.name} ({length})")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in APP_PACKAGES:
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            shape.private_imports.append(f"{module} <- {node.module}.{alias.name}")
            elif isinstance(node, ast.Compare) and not module.startswith("actions.kinds") and _is_kind_test(node):
                shape.kind_branches.append(f"{module}:{node.lineno}")
    return shape


@functools.cache
def duplicate_pairs() -> tuple[str, ...]:
    """The pairs of places in the app code that share six or more lines of the same shape.

    Migrations are generated and never edited, so a pair with a side in one is not counted."""
    command = shutil.which("duplicates")
    if command is None:
        pytest.fail("the `duplicates` command is not on PATH: it measures the app's duplicated code")
    pairs: list[str] = []
    for package in APP_PACKAGES:
        result = subprocess.run(
            [command, "--repo", package, "--most", str(DUPLICATES_MOST), "--seconds", str(DUPLICATES_SECONDS)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=DUPLICATES_SECONDS + 30,
            check=False,
        )
        lines = result.stdout.splitlines()
        problems = [line for line in lines if line.startswith("incomplete:") or "more pairs)" in line]
        assert result.returncode == 0 and not problems, (
            f"`duplicates --repo {package}` did not measure the whole package: "
            f"{problems or result.stderr.strip() or result.returncode}"
        )
        for line in lines:
            row = DUPLICATE_ROW.match(line)
            if row is None:
                continue
            sides = (row["left"], row["right"])
            if any("migrations" in Path(side).parts for side in sides):
                continue
            pairs.append(f"{package}: {line}")
    return tuple(pairs)


def test_print_the_numbers() -> None:
    shape = measure()
    print()
    print(f"{'measure':45} {'now':>5} {'ceiling':>8}")
    for name, count in shape.counts().items():
        print(f"{name:45} {count:>5} {CEILINGS[name]:>8}")
    pairs = duplicate_pairs()
    print(f"{'duplicated pairs (duplicates, no migrations)':45} {len(pairs):>5} {DUPLICATE_PAIRS_CEILING:>8}")
    for name, items in (
        ("duplicated pairs", pairs),
        ("long modules", shape.long_modules),
        ("long functions", shape.long_functions),
        ("kind branches", shape.kind_branches),
        ("private imports", shape.private_imports),
        ("unlayered", shape.unlayered),
        ("internals", shape.internals),
    ):
        print(f"\n{name}:")
        for item in items:
            print(f"  {item}")


@pytest.mark.parametrize("name", list(CEILINGS))
def test_no_number_goes_back_up(name: str) -> None:
    count = measure().counts()[name]
    assert count <= CEILINGS[name], (
        f"{name}: {count}, above its ceiling of {CEILINGS[name]}. Run `pytest tests/test_architecture.py -s` "
        "for the list."
    )


def test_duplicated_code_does_not_grow() -> None:
    pairs = duplicate_pairs()
    assert len(pairs) <= DUPLICATE_PAIRS_CEILING, (
        f"duplicated pairs: {len(pairs)}, above its ceiling of {DUPLICATE_PAIRS_CEILING}. "
        "`duplicates --change` shows the pairs a change adds; make one helper serve both places."
    )


def test_the_kind_branch_detector_sees_the_three_forms() -> None:
    found = [
        _is_kind_test(node)
        for node in ast.walk(
            ast.parse(
                "if kind == 'refund': pass\n"
                "if action.kind in ('refund', 'invoice_adjustment'): pass\n"
                "if action.kind != ActionKind.REFUND: pass\n"
                "if kind == other: pass\n"
            )
        )
        if isinstance(node, ast.Compare)
    ]
    assert found == [True, True, True, False]
