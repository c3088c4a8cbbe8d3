"""The accounting system: a thin client for its Xero-compatible API, and its sandbox."""

from __future__ import annotations
