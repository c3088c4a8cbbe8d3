"""Stand-ins for the receivers, each run as its own process (``python -m harness.sandboxes.X``)."""

from __future__ import annotations
