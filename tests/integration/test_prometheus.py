"""A real Prometheus scrapes running `dramatiq` workers and `estafeta relay`; the stuck-saga alert fires.

The shipped rules (ops/prometheus/alerts.yml) are loaded with every ``for:`` cut to one
second, and Prometheus scrapes every second. Two `dramatiq estafeta_actors` commands run the order
system, each on a metrics port of its own: one for payments, one for the rest; the relay
serves its own. An order placed with `estafeta orders place` completes; then the payments
command is killed, the next order waits at charge_payment, and EstafetaSagasStuck fires
(ESTAFETA_SAGA_STUCK_AFTER is 2 s here), with EstafetaWorkersDown for the killed command.
Every query of the Grafana dashboard runs on the scraped data.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from ..helpers import scalar, wait_until
from ..shop import seed
from . import processes
from .prometheus import Prometheus, require_prometheus
from .relay_faults import free_port

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

DASHBOARD = processes.ROOT / "ops" / "grafana" / "estafeta.json"
#: What this test never makes happen: the dashboard panels showing only these may stay empty.
NOT_HAPPENED = (
    "publish_failed",
    "broker_unavailable",
    "lock_timeouts",
    "compensation",
    'outcome="stale"',
    'outcome="error"',
    'outcome="duplicate"',
)


def _workers(env: dict[str, str], log_dir: Path, name: str, port: int, *queues: str) -> processes.Process:
    argv = [
        str(processes.BIN / "dramatiq"),
        "estafeta_actors",
        "--processes",
        "1",
        "--threads",
        "2",
        "--queues",
        *queues,
    ]
    return processes.Process(name, argv, {**env, "ESTAFETA_METRICS_PORT": str(port)}, log_dir)


def _place(env: dict[str, str]) -> str:
    done = processes.estafeta(
        env, "orders", "place", "--customer", "ann", "--sku", "sku-p", "--amount", "100", "--json"
    )
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)[0]["saga_id"])


def _status(conn: object, saga_id: str) -> str:
    return str(scalar(conn, "SELECT status FROM orders.saga_order WHERE saga_id = %s", saga_id))  # type: ignore[arg-type]


def test_prometheus_scrapes_workers_and_relay_and_the_stuck_saga_alert_fires(
    database_url: str, redis_url: str, runtime, conn, tmp_path: Path
) -> None:
    binary = require_prometheus()
    seed(runtime, {"ann": 10_000}, {"sku-p": 10})
    env = processes.service_env(
        database_url,
        f"{redis_url}-{uuid.uuid4().hex[:6]}",
        ESTAFETA_METRICS_HOST="127.0.0.1",
        ESTAFETA_SAGA_STUCK_AFTER="2",
        ESTAFETA_SAGA_STEP_TIMEOUT="300",  # the watchdog must not compensate while the alert is awaited
    )
    ports = {"rest": free_port(), "payments": free_port(), "relay": free_port()}
    rest = _workers(env, tmp_path, "workers", ports["rest"], "orders", "inventory", "notifications", "pingpong")
    payments = _workers(env, tmp_path, "payments", ports["payments"], "payments")
    relay = processes.relay(env, tmp_path, "--metrics-port", str(ports["relay"]), "--metrics-host", "127.0.0.1")
    jobs = {
        "estafeta-workers": [f"127.0.0.1:{ports['rest']}", f"127.0.0.1:{ports['payments']}"],
        "estafeta-relay": [f"127.0.0.1:{ports['relay']}"],
    }
    prometheus = Prometheus(binary, jobs, tmp_path)
    with processes.running(rest, payments, relay, prometheus.process):
        first = _place(env)
        wait_until(lambda: _status(conn, first) == "completed", timeout=60, what="the first order's saga")
        wait_until(lambda: sum(prometheus.query("up").values()) == 3, timeout=60, what="three targets up")
        wait_until(
            lambda: prometheus.query('max(estafeta_sagas{saga="order",status="completed"})') == {"": 1},
            timeout=30,
            what="the completed saga scraped",
        )
        charged = prometheus.query('estafeta_step_deliveries_total{actor="payments.charge_payment",outcome="ok"}')
        assert charged == {f"127.0.0.1:{ports['payments']}": 1}
        # The relay is scraped on its own schedule: its last publish may be newer than its last scrape.
        wait_until(
            lambda: prometheus.query("sum by (job) (estafeta_outbox_published_total)").get("estafeta-relay", 0) >= 8,
            timeout=30,
            what="the relay's eight publishes scraped",
        )
        assert prometheus.query("max(estafeta_sagas_stuck)") == {"": 0}
        assert prometheus.firing("EstafetaSagasStuck") == []

        payments.kill()  # SIGKILL: the participant is gone
        second = _place(env)
        wait_until(lambda: bool(prometheus.firing("EstafetaSagasStuck")), timeout=60, what="EstafetaSagasStuck")
        assert _status(conn, second) == "running"
        (stuck,) = prometheus.firing("EstafetaSagasStuck")
        assert stuck["saga"] == "order" and stuck["severity"] == "page"
        wait_until(lambda: bool(prometheus.firing("EstafetaWorkersDown")), timeout=30, what="EstafetaWorkersDown")
        (down,) = prometheus.firing("EstafetaWorkersDown")
        assert down["instance"] == f"127.0.0.1:{ports['payments']}"
        assert prometheus.firing("EstafetaRelayDown") == []

        dashboard = json.loads(DASHBOARD.read_text())
        queries = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
        for expr in queries:
            answer = prometheus.api("query", query=expr.replace("$__rate_interval", "1m"))
            assert answer is not None, f"Prometheus rejected the dashboard's query {expr}"
        empty = {e for e in queries if not prometheus.api("query", query=e.replace("$__rate_interval", "1m"))["result"]}
        # Only the panels of what did not happen here may be empty (a counter nothing incremented has no series).
        assert all(any(event in expr for event in NOT_HAPPENED) for expr in empty), empty
