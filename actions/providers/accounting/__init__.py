"""The accounting system: a thin client for its Xero-compatible API (its sandbox is
harness.sandboxes.accounting)."""

from __future__ import annotations
