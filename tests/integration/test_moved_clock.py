"""A moved clock is said by every process as it starts, and shown by the metrics of the workers and the relay.

Production never moves a schema's clock: a moved one is a test's left in the database, or a
write that should not have happened, and it moves every decision of every process.
"""

from __future__ import annotations

import functools
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from estafeta import Clock, Runtime

from ..helpers import wait_until
from . import processes
from .relay_faults import free_port
from .test_worker_metrics import sample, scrape

pytestmark = [pytest.mark.integration]

WARNING = "the clock of schema pingpong is moved (ahead of PostgreSQL's time by 8 days"


def warned(proc: processes.Process, what: str) -> bool:
    return f"estafeta {what}: {WARNING}" in proc.output()


def test_workers_and_relay_warn_at_start_and_serve_the_gauge_of_a_moved_clock(
    database_url: str, redis_url: str, runtime: Runtime, tmp_path: Path
) -> None:
    clock = Clock(runtime, ["pingpong"])
    clock.advance(timedelta(days=8))
    worker_port, relay_port = free_port(), free_port()
    env = processes.service_env(
        database_url,
        f"{redis_url}-{uuid.uuid4().hex[:6]}",
        ESTAFETA_METRICS_PORT=str(worker_port),
        ESTAFETA_METRICS_HOST="127.0.0.1",
    )
    workers = processes.workers(env, tmp_path, processes=1, threads=1, module="tests.worker")
    relay = processes.relay(env, tmp_path, "--metrics-port", str(relay_port), "--metrics-host", "127.0.0.1")
    moved = 'estafeta_clock_moved{service="pingpong"}'
    with processes.running(workers, relay):
        for proc, what in ((workers, "worker"), (relay, "relay")):
            wait_until(functools.partial(warned, proc, what), timeout=60, what=f"the {what}'s warning")
        for port in (worker_port, relay_port):
            wait_until(lambda port=port: sample(scrape(port), moved) == 1, timeout=60, what=f"the gauge on {port}")
        assert sample(scrape(worker_port), 'estafeta_clock_moved{service="orders"}') == 0
        clock.reset()
        for port in (worker_port, relay_port):
            assert sample(scrape(port), moved) == 0
