"""The same step modules, unchanged, on the StubBroker, RabbitMQ and Redis.

Real `dramatiq` worker processes and a real `estafeta relay` process; switching broker
is only ESTAFETA_BROKER_URL.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from estafeta_actors.pingpong import Ping
from estafeta_brokers import broker_from_url
from estafeta_sql import inbox

from ..helpers import message_for, now, scalar, wait_until
from ..services import BROKER_URL_FIXTURES
from . import processes

pytestmark = pytest.mark.integration


# Each broker; the Redis and Kafka runs are long: make test-heavy.
@pytest.fixture(
    params=["rabbitmq", pytest.param("redis", marks=pytest.mark.heavy), pytest.param("kafka", marks=pytest.mark.heavy)]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(BROKER_URL_FIXTURES[request.param]))


def _ping_through_outbox(conn: psycopg.Connection[object], count: int) -> list[uuid.UUID]:
    from estafeta_actors.pingpong import SERVICE as pingpong_service

    ids = [uuid.uuid4() for _ in range(count)]
    with conn.transaction():
        for ping_id in ids:
            pingpong_service.send(conn, Ping(ping_id, now()))
    return ids


def test_step_module_runs_unchanged_on_a_real_broker(
    broker_url: str, database_url: str, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, broker_url)
    ids = _ping_through_outbox(conn, 20)
    with processes.running(processes.workers(env, tmp_path), processes.relay(env, tmp_path)):
        # Its own pings only: a ping another test left on the run's vhost is answered too.
        wait_until(
            lambda: (
                scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE pongs = 1 AND ping_id = ANY(%s)", ids)
                == len(ids)
            ),
            timeout=60,
            what="every ping answered once",
        )
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


@pytest.mark.heavy
def test_malformed_message_is_dead_lettered_and_the_worker_keeps_serving(
    broker_url: str, database_url: str, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, broker_url)
    broker = broker_from_url(broker_url)
    broker.declare_queue("pingpong")
    bad = message_for("pingpong.ping", Ping(uuid.uuid4(), now())).copy(args=({"ping_id": "nope"},))
    with processes.running(processes.workers(env, tmp_path), processes.relay(env, tmp_path)):
        broker.enqueue(bad)
        ids = _ping_through_outbox(conn, 3)
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE pongs = 1") == len(ids),
            timeout=60,
            what="the good pings after the bad one",
        )
        wait_until(lambda: bool(inbox.list_dead_letters(conn, "pingpong")), timeout=30, what="the dead letter")
    broker.close()
    (letter,) = inbox.list_dead_letters(conn, "pingpong")
    assert letter["message_id"] == bad.message_id
    assert "ping_id" in letter["reason"] and "sent_at" in letter["reason"]


def test_worker_refuses_to_start_on_a_bad_setting(tmp_path: Path, database_url: str) -> None:
    env = processes.service_env(database_url, "nats://user:hunter2@example:4222")
    worker = processes.workers(env, tmp_path)
    code = worker.popen.wait(60)
    output = worker.output()
    worker.stop()
    assert code != 0
    assert "ESTAFETA_BROKER_URL: unknown scheme 'nats'" in output
    assert "hunter2" not in output
    assert "Traceback" not in output
