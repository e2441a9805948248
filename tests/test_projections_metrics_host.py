"""``estafeta projections run --metrics-host``: the metrics server listens where it is told, as the relay's does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from estafeta import Runtime, Settings
from examples.lending import app

from .helpers import wait_until
from .http_server import free_port
from .integration.processes import BIN, Process, service_env
from .services import scratch_database


@pytest.fixture
def dsn() -> Iterator[str]:
    with scratch_database() as found:
        runtime = Runtime(Settings(database_url=found))
        app.migrate(runtime)
        runtime.close()
        yield found


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_the_projector_serves_its_metrics_on_the_address_it_is_given(dsn: str, tmp_path: Path) -> None:
    port = free_port()
    argv = [str(BIN / "estafeta"), "--app", "examples.lending", "projections", "run"]
    argv += ["--metrics-port", str(port), "--metrics-host", "127.0.0.2", "--poll-interval", "0.1"]
    projector = Process("projections", argv, service_env(dsn, "stub://"), tmp_path)
    try:
        wait_until(lambda: answers(f"http://127.0.0.2:{port}/metrics"), what="metrics on 127.0.0.2")
        assert not answers(f"http://127.0.0.1:{port}/metrics")  # only where it was told
    finally:
        projector.stop()
