"""The Grafana dashboard and the Prometheus rules in console/deploy/ ask only for metrics that
/metrics exports, and the dashboard shows every alert's metric with the alert's threshold: a
metric renamed or removed in console/metrics.py fails here, not on an operator's empty panel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import REPO_ROOT

pytestmark = pytest.mark.django_db

DEPLOY = REPO_ROOT / "console" / "deploy"
METRIC = re.compile(r"\b(console_[a-z0-9_]+)\b")
# An alert's condition: the selector, the comparison and the threshold.
CONDITION = re.compile(r"^(?P<query>.+?)\s*(?P<op>>=|>|==)\s*(?P<value>[0-9.]+)$")


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included; rows themselves left out."""
    for item in items:
        yield from panels(item.get("panels", []))
        if item.get("type") != "row":
            yield item


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


@pytest.fixture
def exported(client: Client, settings: Any) -> set[str]:
    """The metric names /metrics exports: its families' names and its samples' (a counter's
    ``_total``). A family with no samples (no receiver with a rate limit) still names itself."""
    settings.METRICS_TOKEN = ""
    settings.PRODUCTION_MODE = False
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    names = set()
    for family in text_string_to_metric_families(response.content.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_a_dashboard_panel_asks_for_is_exported(exported: set[str]) -> None:
    asked = {
        (panel["title"], name)
        for panel in panels(dashboard()["panels"])
        for target in panel["targets"]
        for name in METRIC.findall(target["expr"])
    }
    assert asked, "the dashboard's panels name no metric"
    missing = sorted((title, name) for title, name in asked if name not in exported)
    assert not missing, f"panels ask for metrics /metrics does not export: {missing}"


def test_every_metric_an_alert_asks_for_is_exported(exported: set[str]) -> None:
    missing = sorted(
        (rule["alert"], name) for rule in rules() for name in METRIC.findall(rule["expr"]) if name not in exported
    )
    assert not missing, f"alerts on metrics /metrics does not export: {missing}"


def test_every_panel_queries_the_dashboards_prometheus() -> None:
    for panel in panels(dashboard()["panels"]):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert METRIC.search(target["expr"]), (panel["title"], target["expr"])
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_alert_is_on_the_dashboard_with_its_threshold() -> None:
    """An operator paged by an alert finds the panel that shows it, marked at the same value."""
    shown = [
        (target["expr"], {step["value"] for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]})
        for panel in panels(dashboard()["panels"])
        for target in panel["targets"]
    ]
    for rule in rules():
        condition = CONDITION.match(rule["expr"].strip())
        assert condition, f"{rule['alert']}: read no threshold in {rule['expr']!r}"
        query, value = condition["query"], float(condition["value"])
        # The alert's own query, or the panel's wrapped around it (a max over the web processes).
        selector = query if "(" not in query else METRIC.findall(query)[0]
        assert any(selector in expr and value in steps for expr, steps in shown), (
            f"{rule['alert']}: no panel shows {selector} with a threshold at {value:g}"
        )
