"""The scale benchmark (P-e) still runs end to end, and counts the rows a page shows
the way its table says. Its numbers are not judged here (benchmarks are not timed tests): a run
that cannot build, answer or print is."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from tests.bench.bench_scale import rows_shown


def test_rows_shown_counts_the_rows_of_every_table_body_and_no_header() -> None:
    page = (
        "<table><thead><tr><th>Action</th></tr></thead><tbody><tr><td>1</td></tr>\n<tr><td>2</td></tr></tbody></table>"
        "<p>no table</p><table><thead><tr><th>Order</th></tr></thead><tbody>\n  <tr class='x'><td>3</td></tr>"
        "</tbody></table>"
    )
    assert rows_shown(page) == 3
    assert rows_shown("<table><thead><tr><th>Empty</th></tr></thead><tbody></tbody></table>") == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_a_small_run_builds_measures_every_page_and_drops_its_database() -> None:
    # The benchmark reads DATABASE_URL (PostgreSQL in CI) and names a database of its own on it.
    finished = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_scale", "--small", "400", "--large", "800", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=settings.BASE_DIR,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-4000:]
    table = [line for line in finished.stdout.splitlines() if line.startswith("| ")]
    labels = [line.split(" | ")[0].removeprefix("| ") for line in table[1:]]
    assert "search: commonest name, a full page at both sizes" in labels
    assert "search: common name, a full page at 1M only" in labels
    assert len(labels) == 10
    commonest = next(line for line in table if line.startswith("| search: commonest name"))
    # The commonest name is on one order in 37: 400 actions on 100 orders hold at least two of them.
    small_rows, large_rows = (int(n) for n in commonest.rstrip(" |").rsplit("| ", 1)[1].split(" / "))
    assert 0 < small_rows <= large_rows
