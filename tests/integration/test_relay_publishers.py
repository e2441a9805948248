"""The batched publishers against real RabbitMQ and Redis: Dramatiq's bytes and queues, refusals, outages."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dramatiq
import pika
import pytest

from estafeta_brokers import broker_from_url
from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import publisher_for, to_message
from estafeta_brokers.rabbitmq import RabbitmqPublisher
from estafeta_brokers.redis import RedisPublisher
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_sql.outbox import OutboxRow

from ..relay_support import SCHEMA, add
from ..services import rabbitmq_policy
from .relay_faults import consume_all

pytestmark = pytest.mark.integration


def row(seq: int, *, key: str | None = None, queue: str = "relaycheck", **options: Any) -> OutboxRow:
    return OutboxRow(
        id=seq,
        message_id=uuid.uuid4(),
        queue_name=queue,
        actor_name=f"{queue}.record",
        message={"args": [{"key": key, "seq": seq}], "kwargs": {}, "options": {"traceparent": "00-x", **options}},
        ordering_key=key,
        saga_id=None,
        created_at=datetime.now(UTC),
        attempts=0,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def rabbitmq(amqp_url: str) -> Iterator[tuple[dramatiq.Broker, RabbitmqPublisher]]:
    # The run's vhost is shared: another test's relay may have left messages in relaycheck.
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        for queue in ("relaycheck", "relaycheck.DQ", "relaycheck.XQ"):
            conn.channel().queue_delete(queue)
    broker = broker_from_url(amqp_url)
    publisher = publisher_for(broker)
    assert isinstance(publisher, RabbitmqPublisher)
    yield broker, publisher
    publisher.close()
    for queue in list(broker.queues):
        broker.flush(queue)
    broker.close()


@pytest.fixture
def redis_broker(redis_url: str) -> Iterator[tuple[dramatiq.Broker, RedisPublisher]]:
    broker = broker_from_url(redis_url)
    publisher = publisher_for(broker)
    assert isinstance(publisher, RedisPublisher)
    yield broker, publisher
    publisher.close()
    broker.flush_all()
    broker.close()


def test_rabbitmq_batch_is_what_dramatiq_would_have_enqueued(rabbitmq) -> None:
    broker, publisher = rabbitmq
    rows = [row(i, key="k", broker_priority=None) for i in range(300)]
    outcome = publisher.publish(rows)
    assert outcome.confirmed == [r.id for r in rows] and not outcome.failed and outcome.broker_error is None
    # Dramatiq declares the queue, its .DQ and .XQ again with its own arguments: RabbitMQ
    # would refuse (PRECONDITION_FAILED) if ours differed in any of them.
    broker.declare_queue("relaycheck", ensure=True)
    assert broker.get_queue_message_counts("relaycheck") == (300, 0, 0)
    received = consume_all(broker, "relaycheck")
    assert [m.encode() for m in received] == [to_message(r).encode() for r in rows]


def test_rabbitmq_refused_queue_fails_its_rows_and_holds_their_key(rabbitmq, amqp_url: str) -> None:
    _broker, publisher = rabbitmq
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        conn.channel().queue_declare("misdeclared", durable=True)  # no dead-letter arguments
    try:
        rows = [row(1, key="a", queue="misdeclared"), row(2, key="a"), row(3, key="b"), row(4)]
        outcome = publisher.publish(rows)
        assert outcome.confirmed == [3, 4]
        assert list(outcome.failed) == [1] and "PRECONDITION_FAILED" in outcome.failed[1]
        assert outcome.broker_error is None  # row 2 stays pending: it may not overtake row 1
        assert publisher.publish([row(5, key="c")]).confirmed == [5]  # the channel was reopened
    finally:
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            conn.channel().queue_delete("misdeclared")


def test_a_row_rabbitmq_nacks_backs_off_and_is_never_parked_for_it(rabbitmq, amqp_url: str, runtime, conn) -> None:
    # RabbitMQ nacks what it cannot take now: here a full queue that rejects publishes; a
    # quorum queue whose replicas are down or electing a leader is nacked the same way.
    # Not the row's fault: with one attempt allowed, it must still be pending after three
    # nacks, and go out once the queue has room.
    broker, publisher = rabbitmq
    queue = f"relayfull_{uuid.uuid4().hex[:8]}"
    relay = Relay(
        [Outbox(SCHEMA, runtime.database(SCHEMA))],
        publisher,
        RelayConfig(max_attempts=1, attempt_backoff=timedelta(0)),
    )
    with rabbitmq_policy(amqp_url, f"^{queue}$", {"max-length": 1, "overflow": "reject-publish"}):
        add(conn, "a", 1, queue=queue)
        add(conn, "b", 1, queue=queue)
        assert relay.drain_once() == 1
        relay.drain_once()
        relay.drain_once()
        left = conn.execute("SELECT status, attempts, last_error FROM pingpong.outbox").fetchall()
        assert [(status, attempts) for status, attempts, _ in left] == [("pending", 3)], left
        assert "nacked" in left[0][2]
        broker.declare_queue(queue)
        first = consume_all(broker, queue)
        assert relay.drain_once() == 1
    assert sorted(m.args[0]["key"] for m in [*first, *consume_all(broker, queue)]) == ["a", "b"]


def test_rabbitmq_queue_deleted_behind_the_relays_back_is_declared_again(rabbitmq, amqp_url: str) -> None:
    broker, publisher = rabbitmq
    assert publisher.publish([row(1)]).confirmed == [1]
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        conn.channel().queue_delete("relaycheck")
    returned = publisher.publish([row(2)])
    # Unroutable: neither confirmed nor the row's fault; it stays pending, no attempt counted.
    assert returned.confirmed == [] and returned.failed == {} and returned.broker_error is None
    assert publisher.publish([row(2)]).confirmed == [2]
    assert [m.args[0]["seq"] for m in consume_all(broker, "relaycheck")] == [2]


def test_rabbitmq_unreachable_leaves_rows_pending_without_blame() -> None:
    broker = broker_from_url(f"amqp://guest:guest@127.0.0.1:{closed_port()}/")
    publisher = publisher_for(broker, confirm_timeout=2)
    outcome = publisher.publish([row(1), row(2)])
    assert outcome.confirmed == [] and outcome.failed == {}
    assert "cannot connect to RabbitMQ" in (outcome.broker_error or "")
    publisher.close()


def test_a_url_naming_several_rabbitmq_hosts_reaches_the_first_that_answers(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``amqp://u:p@dead:port,live:port/vhost``: the workers' broker and the relay skip the dead host."""
    parts = urlsplit(amqp_url)
    dead = closed_port()
    url = urlunsplit(parts._replace(netloc=f"guest:guest@127.0.0.1:{dead},{parts.hostname}:{parts.port}"))
    queue = f"severalhosts-{uuid.uuid4().hex[:6]}"
    broker = broker_from_url(url)
    publisher = publisher_for(broker)
    try:
        assert isinstance(publisher, RabbitmqPublisher) and len(publisher.parameters) == 2
        broker.enqueue(to_message(row(1, queue=queue)))  # Dramatiq's own connection
        assert publisher.publish([row(2, queue=queue)]).confirmed == [2]  # the relay's
        # The relay says it failed over, and from where.
        warnings = [r.getMessage() for r in caplog.records if r.name == "estafeta_brokers.rabbitmq"]
        assert any(
            f"connected to RabbitMQ at {parts.hostname}:{parts.port}; not reached: 127.0.0.1:{dead}:" in w
            for w in warnings
        ), warnings
        assert [m.args[0]["seq"] for m in consume_all(broker, queue)] == [1, 2]
    finally:
        publisher.close()
        broker.close()


def test_redis_batch_is_what_dramatiq_would_have_enqueued(redis_broker) -> None:
    broker, publisher = redis_broker
    rows = [row(i, key="k") for i in range(300)]
    assert publisher.publish(rows).confirmed == [r.id for r in rows]
    broker.declare_queue("relaycheck")
    received = consume_all(broker, "relaycheck")
    # Byte for byte Dramatiq's own, plus the per-enqueue id RedisBroker.enqueue adds.
    assert len({m.options["redis_message_id"] for m in received}) == 300
    expected = [
        to_message(r).copy(options={"redis_message_id": m.options["redis_message_id"]})
        for r, m in zip(rows, received, strict=True)
    ]
    assert [m.encode() for m in received] == [m.encode() for m in expected]


def test_redis_unreachable_leaves_rows_pending_without_blame() -> None:
    broker = broker_from_url(f"redis://127.0.0.1:{closed_port()}/0")
    publisher = publisher_for(broker, confirm_timeout=2)
    outcome = publisher.publish([row(1), row(2)])
    assert outcome.confirmed == [] and outcome.failed == {}
    assert (outcome.broker_error or "").startswith("Redis: ")
    publisher.close()
