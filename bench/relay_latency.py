"""Commit-to-publish latency through a running ``estafeta relay``, and its memory while draining.

Latency: a writer commits one outbox row per transaction at a fixed rate (as steps do,
NOTIFY included) and notes when each commit returned; a consumer on the broker notes
when each message arrived. Both clocks are this process's ``perf_counter``; the figure
is commit-returned to delivered-to-a-consumer, so it slightly overstates the relay's
commit-to-confirm time.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import psycopg
import redis

from estafeta import Settings
from estafeta_brokers import amqp_urls, broker_from_url, split_namespace
from estafeta_sql import outbox as store

from .relay_kafka import consume_arrivals
from .relay_setup import Services, fill, outbox_empty, relays, warm_up


def _write_at(dsn: str, queue: str, rate: float, seconds: float, committed: dict[str, float]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for i in range(int(rate * seconds)):
            time.sleep(max(0.0, started + i / rate - time.perf_counter()))
            message_id = uuid.uuid4()
            with conn.transaction():
                store.insert(
                    conn,
                    "pingpong",
                    store.OutgoingMessage(
                        message_id=message_id,
                        queue_name=queue,
                        actor_name=f"{queue}.record",
                        args=[{"order_id": str(uuid.uuid4()), "seq": i}],
                        ordering_key=f"order-{i % 100}",
                    ),
                )
            committed[str(message_id)] = time.perf_counter()


def _rabbitmq_consumer(url: str, queue: str, received: dict[str, float], stop: threading.Event) -> None:
    connection = pika.BlockingConnection([pika.URLParameters(one) for one in amqp_urls(url)])
    channel = connection.channel()

    def on_message(_ch: Any, _method: Any, _props: Any, body: bytes) -> None:
        received[json.loads(body)["message_id"]] = time.perf_counter()

    channel.basic_consume(queue, on_message, auto_ack=True)
    while not stop.is_set():
        connection.process_data_events(time_limit=0.05)
    connection.close()


def _redis_consumer(url: str, queue: str, received: dict[str, float], stop: threading.Event) -> None:
    # Dramatiq's Redis queue is a list of ids plus a hash of bodies: pop and read them raw,
    # so that no consumer backoff adds to the figure.
    plain, namespace = split_namespace(url)
    client = redis.Redis.from_url(plain)
    key = f"{namespace}:{queue}"
    while not stop.is_set():
        popped = client.blpop([key], timeout=0.05)
        if popped:
            arrived = time.perf_counter()
            body = client.hget(f"{key}.msgs", popped[1])
            if body:
                received[json.loads(body)["message_id"]] = arrived
    client.close()


def latency(services: Services, broker: str, rate: float, seconds: float, **settings: str) -> dict[str, float]:
    """p50, p99 and max commit-to-delivery latency (ms) at ``rate`` events per second.

    ``settings``: more ``ESTAFETA_*`` variables for the relay (``ESTAFETA_RABBITMQ_QUEUE_TYPE``).
    """
    url = services.url(broker)
    queue = f"bench_latency_{broker}_{int(rate)}"
    env = services.env(url, **settings)
    declaring = broker_from_url(url, **Settings.from_env(env).broker_options)
    if broker == "rabbitmq":
        declaring.declare_queue(queue, ensure=True)  # type: ignore[call-arg]
    consume: Callable[..., None] = {
        "rabbitmq": _rabbitmq_consumer,
        "redis": _redis_consumer,
        "kafka": consume_arrivals,
    }[broker]
    committed: dict[str, float] = {}
    received: dict[str, float] = {}
    stop = threading.Event()
    consumer = threading.Thread(target=consume, args=(url, queue, received, stop), daemon=True)
    with relays(env), psycopg.connect(services.dsn, autocommit=True) as conn:
        warm_up(conn, queue)
        consumer.start()
        _write_at(services.dsn, queue, rate, seconds, committed)
        deadline = time.monotonic() + 30
        # Every committed id, not a count: a reader may also see the warm-up row (Kafka: from the start).
        while any(m not in received for m in committed) and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        consumer.join()
    if broker != "kafka":  # a Kafka topic cannot be flushed; it goes with the run's broker
        declaring.flush(queue)
    declaring.close()
    delays = sorted((received[m] - committed[m]) * 1000 for m in committed if m in received)
    if len(delays) < len(committed):
        raise SystemExit(f"latency run lost {len(committed) - len(delays)} of {len(committed)} messages")
    return {
        "p50_ms": round(statistics.median(delays), 2),
        "p99_ms": round(delays[min(len(delays) - 1, int(len(delays) * 0.99))], 2),
        "max_ms": round(delays[-1], 2),
        "events": len(delays),
    }


def memory(services: Services, rows: int) -> dict[str, float]:
    """The relay's RSS before and while it drains ``rows`` rows to RabbitMQ, in MB."""
    queue = "bench_memory"
    declaring = broker_from_url(services.amqp_url)
    with relays(services.env(services.amqp_url)) as (relay,), psycopg.connect(services.dsn, autocommit=True) as conn:
        # Warmed up on a few thousand rows: pools, buffers and caches exist before the baseline.
        warm_up(conn, queue, 5000)
        time.sleep(0.5)
        baseline = relay.rss_bytes()
        with conn.transaction():
            fill(conn, rows, queue)
        started = time.perf_counter()
        peak = baseline
        while not outbox_empty(conn):
            peak = max(peak, relay.rss_bytes())
            time.sleep(0.05)
        drained = time.perf_counter() - started
        end = relay.rss_bytes()
    declaring.flush(queue)
    declaring.close()
    mb = 1024 * 1024
    return {
        "rows": rows,
        "rows_per_second": round(rows / drained),
        "rss_start_mb": round(baseline / mb, 1),
        "rss_peak_mb": round(peak / mb, 1),
        "rss_end_mb": round(end / mb, 1),
        "growth_mb": round((peak - baseline) / mb, 1),
    }
