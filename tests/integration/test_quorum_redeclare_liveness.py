"""``estafeta queues redeclare`` leaves a quorum queue alone while the heartbeats show who could publish to it.

RabbitMQ 3.10 takes no ``if-empty`` delete on a quorum queue: its emptiness is checked before
the delete, and a message published between the two would be lost. So a quorum queue is
redeclared only when no live relay of the app and no live worker of the queue beats (real
heartbeat rows, written through :class:`Heartbeat`, on the real RabbitMQ); a classic queue
keeps its ``if-empty`` delete and never asks.
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pika
import psycopg
import pytest

from estafeta import Runtime
from estafeta.observability.heartbeats import Heartbeat, Kind, Role
from estafeta.observability.liveness import live_users_of_queue
from estafeta_brokers import broker_from_url
from estafeta_brokers.rabbitmq_queues import QueueDeclarations
from estafeta_brokers.rabbitmq_redeclare import Action, QueueInUse, redeclare_queues
from estafeta_sql import clock
from estafeta_sql.heartbeats import MISSED_BEATS
from examples.welcome import app as welcome_app

from ..services import rabbitmq_messages, rabbitmq_queues, rabbitmq_vhost
from .processes import BIN, ROOT, service_env

pytestmark = pytest.mark.integration

#: The welcome app's queues, one per service with steps.
QUEUES = sorted({spec.queue_name for spec in welcome_app.steps.values()})
#: A service of the welcome app other than the first queue's: a relay beating there serves the whole app.
OTHER = next(service.name for service in welcome_app.services if service.name != QUEUES[0])
#: The tests' beat interval, and a skew of the database clock past which a row is stale.
INTERVAL = 60
STALE = timedelta(seconds=INTERVAL * MISSED_BEATS + 1)


@pytest.fixture
def vhost() -> Iterator[str]:
    """A vhost of this test's own: the app's queue names start empty."""
    with rabbitmq_vhost(f"estafeta-quorum-live-{uuid.uuid4().hex[:8]}") as url:
        yield url


def _quorum_queue_holding_one_message(url: str, queue: str, delivery_limit: int) -> None:
    broker = broker_from_url(url, queue_type="quorum", delivery_limit=delivery_limit)
    try:
        broker.enqueue(dramatiq.Message(queue, "x.y", (), {}, {}))
    finally:
        broker.close()


def _redeclare(database_url: str, url: str) -> subprocess.CompletedProcess[str]:
    env = service_env(database_url, url, ESTAFETA_RABBITMQ_QUEUE_TYPE="quorum", ESTAFETA_MAX_DELIVERIES="9")
    argv = [str(BIN / "estafeta"), "--app", "examples.welcome", "queues", "redeclare"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_live_relay_keeps_the_quorum_queue_and_its_message_until_its_row_is_stale(
    runtime: Runtime, conn: psycopg.Connection[Any], vhost: str, database_url: str
) -> None:
    queue = QUEUES[0]
    _quorum_queue_holding_one_message(vhost, queue, delivery_limit=25)
    relay = Heartbeat([Role(Kind.RELAY, {OTHER: [OTHER]})], runtime.database, interval=INTERVAL)
    relay.beat_once()  # written, never beaten again (as after a SIGKILL): live for MISSED_BEATS intervals
    try:
        refused = _redeclare(database_url, vhost)
        assert refused.returncode == 2, refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line, line
        assert line.startswith(f"estafeta: quorum queue '{queue}' cannot be redeclared while live processes")
        assert f"relay on {socket.gethostname()} pid " in line and "stop them first" in line
        on_server = rabbitmq_queues(vhost)
        assert on_server[queue] == ("quorum", QueueDeclarations("quorum", 25).arguments_of(queue))
        assert rabbitmq_messages(vhost)[queue] == 1

        clock.advance(conn, OTHER, STALE)  # the relay's row is stale now
        done = _redeclare(database_url, vhost)
    finally:
        clock.reset(conn, OTHER)
    assert done.returncode == 0, done.stderr
    assert f"{queue}: redeclared quorum, 1 message(s) kept" in done.stdout.splitlines()
    assert rabbitmq_queues(vhost)[queue][1]["x-delivery-limit"] == 9
    assert rabbitmq_messages(vhost)[queue] == 1


def test_the_users_of_a_queue_are_the_apps_live_relays_and_the_queues_live_workers(
    runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    first, second = QUEUES[0], QUEUES[1]
    relay = Heartbeat([Role(Kind.RELAY, {OTHER: [OTHER]})], runtime.database, interval=INTERVAL)
    worker = Heartbeat([Role(Kind.WORKER, {first: [first]})], runtime.database, interval=INTERVAL)
    other_worker = Heartbeat([Role(Kind.WORKER, {second: [second]})], runtime.database, interval=INTERVAL)
    Heartbeat([Role(Kind.WORKER, {first: [first]})], runtime.database, interval=INTERVAL).beat_once()
    try:
        clock.advance(conn, first, STALE)  # that worker's row is stale; the rows written after it are live
        with relay, worker, other_worker:
            users = live_users_of_queue(welcome_app, runtime.database, first)
            assert {row.process_id for row in users} == {relay.process_id, worker.process_id}
            others = live_users_of_queue(welcome_app, runtime.database, second)
            assert {row.process_id for row in others} == {relay.process_id, other_worker.process_id}
        assert live_users_of_queue(welcome_app, runtime.database, first) == []
    finally:
        clock.reset(conn, first)


def test_a_quorum_queue_going_back_to_classic_is_refused_while_someone_could_publish(amqp_url: str) -> None:
    queue = f"back-{uuid.uuid4().hex[:6]}"
    _quorum_queue_holding_one_message(amqp_url, queue, delivery_limit=25)
    asked: list[str] = []

    def users(name: str) -> list[str]:
        asked.append(name)
        return ["relay on elsewhere pid 42"]

    with pytest.raises(QueueInUse, match=rf"quorum queue '{queue}' .* \(relay on elsewhere pid 42\)"):
        redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations(), [queue], users=users)
    assert asked == [queue]
    assert rabbitmq_queues(amqp_url)[queue][0] == "quorum"
    assert rabbitmq_messages(amqp_url)[queue] == 1
    done = redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations(), [queue], users=lambda _: [])
    assert [(d.action, d.moved) for d in done] == [
        (Action.REDECLARED, 1),
        (Action.REDECLARED, 0),
        (Action.REDECLARED, 0),
    ]
    assert rabbitmq_queues(amqp_url)[queue][0] == "classic"
    assert rabbitmq_messages(amqp_url)[queue] == 1


def test_a_classic_queue_keeps_its_if_empty_delete_and_never_asks_who_is_live(amqp_url: str) -> None:
    queue = f"classic-{uuid.uuid4().hex[:6]}"
    broker = broker_from_url(amqp_url)
    try:
        broker.enqueue(dramatiq.Message(queue, "x.y", (), {}, {}))
    finally:
        broker.close()

    def users(name: str) -> list[str]:
        raise AssertionError(f"asked who uses classic queue {name}")

    done = redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations("quorum", 25), [queue], users=users)
    assert [(d.action, d.moved) for d in done] == [
        (Action.REDECLARED, 1),
        (Action.REDECLARED, 0),
        (Action.REDECLARED, 0),
    ]
    assert rabbitmq_queues(amqp_url)[queue][0] == "quorum"
    assert rabbitmq_messages(amqp_url)[queue] == 1
