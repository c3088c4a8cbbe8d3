"""Benchmarks: scripts that measure, not pass/fail tests (pytest does not collect them).

Run one with ``python -m tests.bench.<name> --help``.
"""

from __future__ import annotations
