"""The shelf example end to end on RabbitMQ: the FastAPI service under uvicorn, `estafeta relay`, `dramatiq` workers."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn

from ..helpers import scalar, wait_until
from ..services import scratch_database
from ..test_shelf_api import free_port
from ..test_sqlalchemy import engine_url
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]  # ~30 s: workers, a relay, a kill


def test_placements_reach_the_orm_step_over_rabbitmq_once_each_even_when_the_worker_is_killed(
    amqp_url: str, tmp_path: Path
) -> None:
    from examples.shelf.api import make_api

    with scratch_database() as dsn:
        env = {**processes.service_env(dsn, amqp_url), "ESTAFETA_APP": "examples.shelf"}
        migrated = processes.estafeta(env, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        port = free_port()
        url = engine_url(dsn).render_as_string(hide_password=False)
        server = uvicorn.Server(uvicorn.Config(make_api(url), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_until(lambda: server.started, what="uvicorn")

        async def place_all() -> list[int]:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                keys = [str(uuid.uuid4()) for _ in range(10)]
                sent = [
                    client.post("/items", json={"name": f"item {n}"}, headers={"Idempotency-Key": key})
                    for n, key in enumerate(keys)
                    for _ in range(2)
                ]
                return [r.status_code for r in await asyncio.gather(*sent)]

        try:
            statuses = asyncio.run(place_all())
        finally:
            server.should_exit = True
            thread.join(timeout=30)
        assert set(statuses) <= {201, 409} and statuses.count(201) >= 10
        workers = processes.workers(env, tmp_path, module="examples.shelf.worker")
        relay = processes.relay(env, tmp_path)
        with psycopg.connect(dsn, autocommit=True) as conn, processes.running(workers, relay):
            wait_until(lambda: scalar(conn, "SELECT count(*) FROM shelf.inbox") >= 1, timeout=60, what="a step")
            workers.kill(signal.SIGKILL)  # mid-flight: its unacknowledged messages come back
            workers = processes.workers(env, tmp_path, module="examples.shelf.worker")
            with processes.running(workers):
                wait_until(
                    lambda: scalar(conn, "SELECT count(*) FROM shelf.items WHERE quantity = 1") == 10,
                    timeout=90,
                    what="every item restocked once",
                )
            assert scalar(conn, "SELECT count(*) FROM shelf.items") == 10
            assert scalar(conn, "SELECT sum(quantity) FROM shelf.items") == 10  # no restock twice
            assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 10
