from __future__ import annotations

from django.apps import AppConfig


class ActionsConfig(AppConfig):
    name = "actions"
    verbose_name = "Intent log"

    def ready(self) -> None:
        # The layers above the audit trail register what they must hear of each state change;
        # every process (web, worker, dispatcher) starts Django, so every one registers them.
        from actions.workflows import wake  # noqa: F401
