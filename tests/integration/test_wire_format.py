"""The relay's bytes against Dramatiq's own ``enqueue``, read raw off RabbitMQ and Redis.

The relay re-implements Dramatiq's enqueue (the Redis ``dispatch`` script's arguments,
``_max_unpack_size``, RabbitMQ's message properties and queue arguments) so that it can
publish a batch at a time. pyproject bounds ``dramatiq`` to the versions tested; these
tests are what makes an upgrade that changes the wire format fail here, loudly, instead
of leaving unreadable messages in production queues.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pika
import pytest
import redis
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL

from estafeta_brokers import broker_from_url, split_namespace
from estafeta_brokers.publish import publisher_for, to_message
from estafeta_sql.outbox import OutboxRow
from tests.services import rabbitmq_queues

pytestmark = pytest.mark.integration

QUEUE = "wirecheck"


def _row(seq: int, queue: str = QUEUE, **options: Any) -> OutboxRow:
    return OutboxRow(
        id=seq,
        message_id=uuid.uuid4(),
        queue_name=queue,
        actor_name=f"{queue}.record",
        message={
            "args": [{"seq": seq, "text": "é ☃"}],
            "kwargs": {},
            "options": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "saga_id": str(uuid.uuid4()), **options},
        },
        ordering_key="k",
        saga_id=None,
        created_at=datetime.now(UTC),
        attempts=0,
    )


def _rabbitmq_get(url: str, queue: str = QUEUE) -> tuple[bytes, dict[str, Any]]:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        method, properties, body = conn.channel().basic_get(queue, auto_ack=True)
    assert method is not None, "no message in the queue"
    return body, {k: v for k, v in vars(properties).items() if v is not None}


def test_rabbitmq_bytes_and_properties_are_dramatiqs_own(amqp_url: str) -> None:
    broker = broker_from_url(amqp_url)
    publisher = publisher_for(broker)
    try:
        broker.declare_queue(QUEUE, ensure=True)
        for options in ({}, {"broker_priority": 5}):
            row = _row(1, **options)
            broker.enqueue(to_message(row))  # Dramatiq's own path
            theirs = _rabbitmq_get(amqp_url)
            assert publisher.publish([row]).confirmed == [row.id]
            body, properties = _rabbitmq_get(amqp_url)
            # Plus the message id as a property: a returned message is matched by it.
            assert properties.pop("message_id") == str(row.message_id)
            assert (body, properties) == theirs
    finally:
        publisher.close()
        broker.flush_all()
        broker.close()


def test_rabbitmq_bytes_and_properties_on_quorum_queues_are_dramatiqs_own(amqp_url: str) -> None:
    queue = f"{QUEUE}-quorum"
    broker = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=25)
    publisher = publisher_for(broker)
    try:
        broker.declare_queue(queue, ensure=True)
        row = _row(1, queue)
        broker.enqueue(to_message(row))  # Dramatiq's own path, on the quorum queue
        theirs = _rabbitmq_get(amqp_url, queue)
        assert publisher.publish([row]).confirmed == [row.id]
        body, properties = _rabbitmq_get(amqp_url, queue)
        assert properties.pop("message_id") == str(row.message_id)
        assert (body, properties) == theirs
        assert theirs[1]["headers"] == {"x-delivery-count": 0}  # a quorum queue's delivery, read raw
    finally:
        publisher.close()
        broker.close()


def test_workers_and_relay_declare_the_same_quorum_queues(amqp_url: str) -> None:
    """Either side may declare a queue first; the other's declaration is identical (no PRECONDITION_FAILED)."""
    first_by_workers, first_by_relay = f"{QUEUE}-q-workers", f"{QUEUE}-q-relay"
    broker = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=7)
    publisher = publisher_for(broker)
    try:
        broker.declare_queue(first_by_workers, ensure=True)
        rows = [_row(1, first_by_relay), _row(2, first_by_workers)]
        outcome = publisher.publish(rows)
        assert (outcome.confirmed, outcome.failed) == ([1, 2], {})
        broker.declare_queue(first_by_relay, ensure=True)  # after the relay: no mismatch either
        on_server = rabbitmq_queues(amqp_url)
        for queue in (first_by_workers, first_by_relay):
            dead = {"x-queue-type": "quorum", "x-message-ttl": DEAD_MESSAGE_TTL}
            live = {
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"{queue}.XQ",
                "x-delivery-limit": 7,
            }
            assert on_server[queue] == ("quorum", live)
            assert on_server[f"{queue}.DQ"] == ("quorum", live)
            assert on_server[f"{queue}.XQ"] == ("quorum", dead)
    finally:
        publisher.close()
        broker.close()


def _redis_contents(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """Every key of the queue, with each per-enqueue ``redis_message_id`` replaced by a placeholder."""
    found: dict[str, Any] = {}
    for key in sorted(client.scan_iter(f"{namespace}:{QUEUE}*")):
        name = key.decode()
        kind = client.type(key).decode()
        if kind == "hash":
            found[name] = sorted(client.hvals(key))
        elif kind == "list":
            found[name] = len(client.lrange(key, 0, -1))
        else:
            found[name] = kind
    text = repr(found)
    return {
        "keys": sorted(found),
        "text": re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", text),
    }


def test_redis_keys_and_bytes_are_dramatiqs_own(redis_url: str) -> None:
    url = redis_url + f"-wire-{uuid.uuid4().hex[:6]}"
    plain, namespace = split_namespace(url)
    assert namespace is not None
    broker = broker_from_url(url)
    publisher = publisher_for(broker)
    client = redis.Redis.from_url(plain)
    try:
        row = _row(1)
        broker.declare_queue(QUEUE)
        broker.enqueue(to_message(row))  # Dramatiq's own path
        theirs = _redis_contents(client, namespace)
        broker.flush_all()
        assert publisher.publish([row]).confirmed == [row.id]
        ours = _redis_contents(client, namespace)
        assert theirs["keys"], "Dramatiq's enqueue wrote nothing under the namespace"
        assert ours == theirs
    finally:
        publisher.close()
        broker.flush_all()
        broker.close()
        client.close()
