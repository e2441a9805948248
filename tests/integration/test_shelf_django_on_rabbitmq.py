"""The Django shelf end to end on RabbitMQ: its view under `django-admin runserver`, `estafeta relay`, its ORM step."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import dramatiq
import httpx
import psycopg
import pytest

from estafeta_brokers import broker_from_url

from ..helpers import scalar, wait_until
from ..services import scratch_database
from ..test_shelf_api import free_port
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]  # ~30 s: a web server, workers, a relay, a kill


def serving(url: str) -> bool:
    try:
        httpx.get(f"{url}/items", timeout=5)  # a GET: 405, once the server answers
    except httpx.TransportError:
        return False
    return True


def test_the_django_view_places_items_that_reach_their_step_over_rabbitmq_once_each_even_when_the_worker_is_killed(
    amqp_url: str, tmp_path: Path
) -> None:
    with scratch_database() as dsn:
        env = {**processes.service_env(dsn, amqp_url), "ESTAFETA_APP": "examples.shelf"}
        migrated = processes.estafeta(env, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        web_env = {**env, "DJANGO_SETTINGS_MODULE": "examples.shelf_django.settings", "SHELF_CAPACITY": "10"}
        web = processes.Process(
            "django",
            [str(processes.BIN / "django-admin"), "runserver", "--noreload", f"127.0.0.1:{port}"],
            web_env,
            tmp_path,
        )

        async def place(client: httpx.AsyncClient, name: str, key: str) -> httpx.Response:
            return await client.post("/items", json={"name": name}, headers={"Idempotency-Key": f'"{key}"'})

        async def place_all() -> tuple[list[int], list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                keys = [str(uuid.uuid4()) for _ in range(10)]
                # Each placement twice at once (a client retrying early): one item per key.
                sent = [place(client, f"item {n}", key) for n, key in enumerate(keys) for _ in range(2)]
                statuses = [r.status_code for r in await asyncio.gather(*sent)]
                # The 11th item is refused after its write (the shelf holds 10): its Restock goes too.
                full = [await place(client, "one too many", "k-full") for _ in range(2)]
                return statuses, full

        with psycopg.connect(dsn, autocommit=True) as conn:
            with processes.running(web):
                wait_until(lambda: serving(base), timeout=60, what="django-admin runserver")
                statuses, full = asyncio.run(place_all())
            assert set(statuses) <= {201, 409} and statuses.count(201) >= 10, (statuses, web.log.read_text()[-4000:])
            assert [r.status_code for r in full] == [409, 409] and full[1].headers["Idempotent-Replayed"] == "true"
            assert scalar(conn, "SELECT count(*) FROM shelf.items") == 10
            assert scalar(conn, "SELECT count(*) FROM shelf.outbox") == 10  # none for the refused 11th
            assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 11  # the refusal is k-full's answer
            row = conn.execute(
                "SELECT message_id, queue_name, actor_name, message FROM shelf.outbox LIMIT 1"
            ).fetchone()
            assert row is not None
            message_id, queue_name, actor_name, body = row

            # The Django project's workers: Restock's step updates the Item through Django's ORM.
            workers = processes.workers(web_env, tmp_path, module="examples.shelf_django.worker")
            relay = processes.relay(env, tmp_path)
            with processes.running(workers, relay):
                wait_until(lambda: scalar(conn, "SELECT count(*) FROM shelf.inbox") >= 1, timeout=60, what="a step")
                workers.kill(signal.SIGKILL)  # mid-flight: its unacknowledged messages come back
                workers = processes.workers(web_env, tmp_path, module="examples.shelf_django.worker")
                with processes.running(workers):
                    wait_until(
                        lambda: scalar(conn, "SELECT count(*) FROM shelf.items WHERE quantity = 1") == 10,
                        timeout=90,
                        what="every item restocked once",
                    )
                    # A Restock delivered once more (the same message id): the inbox absorbs it.
                    broker = broker_from_url(amqp_url)
                    try:
                        broker.declare_queue(queue_name)
                        broker.enqueue(
                            dramatiq.Message(
                                queue_name=queue_name,
                                actor_name=actor_name,
                                args=tuple(body["args"]),
                                kwargs={},
                                options=dict(body.get("options", {})),
                                message_id=str(message_id),
                            )
                        )
                    finally:
                        broker.close()
                    wait_until(
                        lambda: f"duplicate delivery of {message_id} absorbed" in workers.output(),
                        timeout=60,
                        what="the duplicate absorbed",
                    )
                    assert "CONN_MAX_AGE" not in workers.output()  # each worker thread kept its connection
            assert scalar(conn, "SELECT count(*) FROM shelf.items") == 10
            assert scalar(conn, "SELECT sum(quantity) FROM shelf.items") == 10  # no restock twice
            assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 10
