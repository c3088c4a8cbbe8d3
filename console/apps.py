from __future__ import annotations

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in
from django.db.models.signals import post_migrate


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Effect console"

    def ready(self) -> None:
        from console import checks  # noqa: F401 (registers the deploy checks)
        from console.middleware import session_start_record
        from console.roles import ensure_roles
        from console.timezones import time_zone_remember

        user_logged_in.connect(session_start_record, dispatch_uid="console.session_start_record")
        user_logged_in.connect(time_zone_remember, dispatch_uid="console.time_zone_remember")

        # Roles are part of the schema: (re)applied after every migrate and flush, including
        # the test database's. post_migrate is sent per app that has models; approvals comes
        # last in INSTALLED_APPS, so every permission exists by the time it is sent for it.
        post_migrate.connect(ensure_roles, dispatch_uid="console.ensure_roles")

        # Off unless OTEL_TRACES_EXPORTER names an exporter (console.tracing). Here, before any
        # request handler loads the middleware, so that Django's instrumentation is in it.
        from console.tracing import install_tracing, process_role

        install_tracing(service=process_role())
