"""Metrics of ``dramatiq`` worker processes: one port per ``dramatiq`` command, summed over its processes.

Two worker processes share the pings; the one address of their command reports every
delivery of both (prometheus_client's multiprocess files, summed by a Dramatiq fork),
and the gauges read from the tables. The files live in a directory of the command's own,
which the next command's metrics server removes.
"""

from __future__ import annotations

import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from estafeta.observability.worker_metrics import command_id, sweep
from estafeta_actors.pingpong import SERVICE as pingpong

from ..helpers import scalar, wait_until
from . import processes
from .relay_faults import free_port

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def scrape(port: int) -> str:
    """The metrics page on ``port`` (empty while nothing listens yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def sample(text: str, line_start: str) -> float | None:
    """The value of the first sample line starting with ``line_start``."""
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_two_worker_processes_serve_their_summed_metrics_on_one_port(
    database_url: str, redis_url: str, runtime, conn, tmp_path: Path
) -> None:
    broker_url = f"{redis_url}-{uuid.uuid4().hex[:6]}"  # queues of this test's own
    port = free_port()
    env = processes.service_env(
        database_url, broker_url, ESTAFETA_METRICS_PORT=str(port), ESTAFETA_METRICS_HOST="127.0.0.1"
    )
    workers = processes.workers(env, tmp_path, processes=2, threads=2, module="tests.worker")
    relay = processes.relay(env, tmp_path)
    directory = Path(tempfile.gettempdir()) / f"estafeta-metrics-{command_id(workers.popen.pid)}"
    with processes.running(workers, relay):
        with conn.transaction():
            for _ in range(40):
                pingpong.send(conn, pingpong_message())
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE pongs = 1") == 40, timeout=60)
        ok = 'estafeta_step_deliveries_total{actor="pingpong.pong",outcome="ok"}'
        wait_until(lambda: sample(scrape(port), ok) == 40, timeout=30, what="40 pongs on the metrics page")
        text = scrape(port)
        pids = {path.stem.rsplit("_", 1)[1] for path in directory.glob("counter_*.db")}
    assert sample(text, 'estafeta_step_deliveries_total{actor="pingpong.ping",outcome="ok"}') == 40
    assert sample(text, 'estafeta_step_duration_seconds_count{actor="pingpong.ping"}') == 40
    assert len(pids) == 2, pids  # both worker processes delivered some, one page reports both
    assert sample(text, 'estafeta_dead_letters{service="pingpong"}') == 0
    assert sample(text, 'estafeta_outbox_pending_count{service="pingpong"}') == 0
    assert sample(text, 'estafeta_sagas{saga="order",status="running"}') == 0
    # The next command's metrics server removes this one's directory, the command being gone.
    assert directory in sweep(directory.parent)
    assert not directory.exists()


def pingpong_message() -> object:
    from datetime import UTC, datetime

    from estafeta_actors.pingpong import Ping

    return Ping(uuid.uuid4(), datetime.now(UTC))
