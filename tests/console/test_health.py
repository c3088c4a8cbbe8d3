"""/healthz, /readyz and the Celery worker health check."""

from __future__ import annotations

import json
import runpy
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.test import Client

from console import health
from console.celery import app
from console.gunicorn_logging import access_record

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def migrations_checked_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_migrations_applied", False)


@pytest.mark.django_db
def test_healthz_answers_without_touching_the_database(django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}


@pytest.mark.django_db
def test_readyz_is_200_when_database_migrations_and_broker_are_fine() -> None:
    response = Client().get("/readyz")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True,
        "migrations": True,
        "broker": True,
    }
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_readyz_is_503_naming_an_unreachable_broker(settings: Any) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}

    response = Client().get("/readyz")

    assert response.status_code == 503
    broker = response.json()["checks"]["broker"]
    assert broker["ok"] is False and "broker unreachable" in broker["error"]
    assert broker["ms"] < 5000


@pytest.mark.django_db
def test_readyz_is_503_when_the_database_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(self: Any, sql: str, params: Any = None) -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr("django.db.backends.utils.CursorWrapper.execute", down)

    response = Client().get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"]["database"]["error"] == "database unreachable: OperationalError"


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "django.db.migrations.executor.MigrationExecutor.migration_plan", lambda self, targets: [("pending", False)]
    )

    response = Client().get("/readyz")

    assert response.status_code == 503
    assert "1 migrations not applied" in response.json()["checks"]["migrations"]["error"]


@pytest.mark.django_db
def test_the_probes_answer_any_host_over_plain_http(settings: Any) -> None:
    """A load balancer probes the process by IP over HTTP: no 400 for the host, no redirect."""
    settings.ALLOWED_HOSTS = ["console.example.com"]
    settings.SECURE_SSL_REDIRECT = True

    assert Client().get("/healthz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    assert Client().get("/readyz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    assert Client().get("/login/", HTTP_HOST="10.0.0.7:8000").status_code == 400


def test_a_probe_refuses_other_methods() -> None:
    response = Client().post("/healthz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


@pytest.mark.processes
def test_celery_ping_fails_when_no_worker_answers(broker_url: str, settings: Any) -> None:
    settings.CELERY_BROKER_URL = broker_url
    app.conf.broker_url = broker_url
    out = StringIO()

    with pytest.raises(SystemExit) as exited:
        call_command("celery_ping", "--timeout", "0.5", stdout=out)

    assert exited.value.code == 1
    assert json.loads(out.getvalue()) == {"healthy": False, "workers": [], "expected_at_least": 1}


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_celery_ping_passes_when_a_worker_answers(workers: Any) -> None:
    worker = workers.start()
    out = StringIO()

    call_command("celery_ping", "--timeout", "3", stdout=out)

    report = json.loads(out.getvalue())
    assert report["healthy"] is True
    assert [name.split("@")[0] for name in report["workers"]] == [worker.name]


def test_the_access_log_line_is_json_even_with_quotes_in_the_path() -> None:
    atoms = {"h": "127.0.0.1", "m": "GET", "U": '/api/v1/actions/a"b', "q": "", "s": "404", "B": 120, "D": 2500}
    atoms["{x-request-id}o"] = "abc"

    line = json.dumps(access_record(atoms))

    record = json.loads(line)
    assert record["path"] == '/api/v1/actions/a"b'
    assert record["status"] == 404 and record["duration_ms"] == 2.5 and record["request_id"] == "abc"


def test_the_gunicorn_config_takes_workers_from_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.setattr("multiprocessing.cpu_count", lambda: 4)

    config = runpy.run_path(str(REPO_ROOT / "console" / "gunicorn_conf.py"))

    assert config["workers"] == 9
    assert config["timeout"] == 30 and config["graceful_timeout"] == 30
    assert config["logger_class"].__name__ == "JsonAccessLogger"
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    assert runpy.run_path(str(REPO_ROOT / "console" / "gunicorn_conf.py"))["workers"] == 3
