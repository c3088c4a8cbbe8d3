from __future__ import annotations

from django.apps import AppConfig


class HarnessConfig(AppConfig):
    """Installed for its management commands (``seed_demo``, ``chaos_run``); it has no models."""

    name = "harness"
    verbose_name = "Harness: chaos runs, sandboxes and the demo"
