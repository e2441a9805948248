"""Helpers of the relay fault tests: a broker that never answers, a private RabbitMQ node, queue reading."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import psycopg

from estafeta_brokers import broker_from_url

from ..rabbit_servers import free_port, private_rabbitmq_node

__all__ = [
    "blackhole",
    "consume_all",
    "free_port",
    "private_rabbitmq",
    "read_queue",
    "relay_waits_to_delete",
    "unlocked_rows",
    "with_port",
]


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A port whose TCP handshake succeeds (the kernel's backlog) and that never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def with_port(url: str, port: int) -> str:
    """``url`` pointing at ``port`` on 127.0.0.1 instead."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    user = f"{parts.username}:{parts.password}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


@contextlib.contextmanager
def private_rabbitmq(*, host: str = "127.0.0.1", netns: str | None = None) -> Iterator[tuple[str, Callable[..., None]]]:
    """A RabbitMQ node of this test's own (never the shared one): its URL and its ``rabbitmqctl``.

    With ``netns``, the node (and its own epmd, on that namespace's loopback) runs inside
    that network namespace, listening for AMQP on ``host``; ``rabbitmqctl`` runs there too.
    """
    with private_rabbitmq_node(address=host, netns=netns) as node:

        def rabbitmqctl(*args: str) -> None:
            node.ctl(*args)

        yield node.url(), rabbitmqctl


def read_queue(broker_url: str, queue: str, timeout_ms: int = 2000) -> list[dramatiq.Message[Any]]:
    """Every message on ``queue``, read (and acked) through Dramatiq's own consumer, in order.

    On Kafka: read from every partition outside any consumer group, partition by
    partition (the order is per partition, and a key's records share one).
    """
    if broker_url.startswith("kafka:"):
        from ..kafka_support import read_topic

        return [record.message() for record in read_topic(broker_url, queue)]
    broker = broker_from_url(broker_url)
    broker.declare_queue(queue)
    try:
        return consume_all(broker, queue, timeout_ms)
    finally:
        broker.close()


def consume_all(broker: dramatiq.Broker, queue: str, timeout_ms: int = 1500) -> list[dramatiq.Message[Any]]:
    """Every message on ``queue``, through ``broker``'s own consumer (acked), in order."""
    consumer = broker.consume(queue, prefetch=500, timeout=timeout_ms)
    found = []
    try:
        for message in consumer:
            if message is None:
                break
            consumer.ack(message)
            found.append(dramatiq.Message(**message.asdict()))
    finally:
        consumer.close()
    return found


def relay_waits_to_delete(conn: psycopg.Connection[Any]) -> bool:
    """Whether the relay of this database is blocked in its DELETE (the broker has confirmed)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'estafeta-relay' AND wait_event_type = 'Lock' AND query LIKE 'DELETE%%'"
    ).fetchone()
    return bool(row and row[0])


def unlocked_rows(conn: psycopg.Connection[Any]) -> int:
    """Outbox rows no transaction holds (``SKIP LOCKED`` sees past the relay's claim)."""
    with conn.transaction():
        row = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM pingpong.outbox FOR UPDATE SKIP LOCKED) AS free"
        ).fetchone()
    return int(row[0]) if row else 0
