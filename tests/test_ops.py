"""The alert rules, the Prometheus example config and the Grafana dashboard shipped in ``ops/``.

``promtool`` (Debian's prometheus package) checks the files and runs the rules' unit tests;
every metric the rules, the dashboard and the documentation name is one estafeta exports, and
every metric estafeta exports is in the generated metrics reference.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from .services import require
from .test_docs import reference

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "ops"
#: Suffixes Prometheus adds to counters and histograms.
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def promtool() -> str:
    """The path of ``promtool`` (skips, or fails under CI, without it)."""
    found = shutil.which("promtool")
    require("promtool (apt-get install prometheus)", found is not None, "not on PATH")
    assert found is not None
    return found


@cache
def exported() -> frozenset[str]:
    """Every metric family estafeta's modules define or serve from the tables (as the reference lists them)."""
    return frozenset(metric.name for metric in reference().metrics())


def family(name: str, families: frozenset[str]) -> str | None:
    """The family of ``families`` a sample name belongs to (``x_total`` is a sample of ``x``)."""
    if name in families:
        return name
    return next((name.removesuffix(s) for s in SUFFIXES if name.removesuffix(s) in families), None)


#: Names in the texts that look like metrics and are not: NOTIFY channels.
NOT_METRICS = {"estafeta_events", "estafeta_outbox"}
#: The pytest plugin's fixture and ini option names (estafeta.testing), not metrics either.
NOT_METRICS |= {"estafeta_app", "estafeta_declared_app", "estafeta_runtime", "estafeta_database_url"}
#: The names the folders are installed under (estafeta_sql for sql/ ...), not metrics.
NOT_METRICS |= {"estafeta_actors", "estafeta_brokers", "estafeta_cli", "estafeta_console", "estafeta_sql"}


def named_in(text: str) -> set[str]:
    """The estafeta metric (sample) names a text mentions."""
    return set(re.findall(r"\bestafeta_[a-z_]+[a-z]", text)) - NOT_METRICS


def test_promtool_accepts_the_rules_and_the_config_and_the_rules_pass_their_tests() -> None:
    tool = promtool()
    for argv in (
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        done = subprocess.run([tool, *argv], cwd=OPS / "prometheus", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = (OPS / "prometheus" / "alerts.yml").read_text()
    tests = (OPS / "prometheus" / "alerts_test.yml").read_text()
    alerts = set(re.findall(r"- alert: (\w+)", rules))
    assert len(alerts) == 19
    assert alerts == set(re.findall(r"alertname: (\w+)", tests))


def test_the_rules_the_dashboard_and_the_docs_name_only_metrics_that_exist() -> None:
    known = exported()
    pages = sorted((ROOT / "docs").rglob("*.md"))
    for path in (OPS / "prometheus" / "alerts.yml", OPS / "grafana" / "estafeta.json", ROOT / "README.md", *pages):
        unknown = {name for name in named_in(path.read_text()) if family(name, known) is None}
        assert not unknown, f"{path.name} names metrics estafeta does not export: {sorted(unknown)}"


def test_the_metrics_reference_documents_every_metric() -> None:
    """The reference page's table is generated from the code: it lists every metric family exported."""
    known = exported()
    table = {
        family(name, known) for name in re.findall(r"^\| `(estafeta_[a-z_]+)", reference().metrics_markdown(), re.M)
    }
    assert known - table == set()


def test_the_dashboard_is_a_grafana_dashboard_with_a_query_in_every_panel() -> None:
    dashboard = json.loads((OPS / "grafana" / "estafeta.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert dashboard["uid"] == "estafeta" and dashboard["schemaVersion"] >= 36
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    known = exported()
    shown = {family(name, known) for p in panels for t in p["targets"] for name in named_in(t["expr"])}
    # What an operator must see: the seed's four, stuck sagas, dead letters.
    assert {
        "estafeta_outbox_pending_count",
        "estafeta_outbox_publish_latency_seconds",
        "estafeta_outbox_failed_count",
        "estafeta_saga_compensation",
        "estafeta_sagas_stuck",
        "estafeta_dead_letters",
        # Seed 000: autovacuum on the outbox; and projection lag.
        "estafeta_table_dead_tuples",
        "estafeta_table_last_autovacuum_timestamp_seconds",
        "estafeta_projection_lag_seconds",
    } <= shown
