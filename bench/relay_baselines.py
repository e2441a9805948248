"""The relay benchmark's ceilings and floor, measured in the same run on the same machine.

- raw pika, batches of 100 with publisher confirms: the most a Python publisher gets
  out of this RabbitMQ;
- Dramatiq's own ``enqueue`` (RabbitMQ with ``confirm_delivery``, and Redis): what an
  application publishing directly, without an outbox, gets;
- the seed article's relay, as written: a 500 ms ticker, 100 rows per tick, one
  confirmed publish and one ``UPDATE ... SET status = 'PUBLISHED'`` per row; and the
  same without its sleep.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import dramatiq
import pika
import psycopg

from estafeta_brokers import broker_from_url

_SEED_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS bench_seed;
DROP TABLE IF EXISTS bench_seed.outbox_events;
CREATE TABLE bench_seed.outbox_events (
  id             UUID PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type VARCHAR(100) NOT NULL,
  aggregate_id   VARCHAR(100) NOT NULL,
  event_type     VARCHAR(100) NOT NULL,
  payload        JSONB        NOT NULL,
  created_at     TIMESTAMPTZ  NOT NULL DEFAULT NOW(),
  published_at   TIMESTAMPTZ,
  retry_count    INT          NOT NULL DEFAULT 0,
  status         VARCHAR(20)  NOT NULL DEFAULT 'PENDING'
    CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED'))
);
CREATE INDEX idx_outbox_status_created ON bench_seed.outbox_events (status, created_at) WHERE status = 'PENDING';
"""
_SEED_FILL = """
INSERT INTO bench_seed.outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'order-' || (i %% 1000), 'OrderCreated',
       jsonb_build_object('order_id', gen_random_uuid()::text, 'amount_cents', i, 'sent_at', now()::text)
FROM generate_series(1, %(rows)s) AS i
"""
_SEED_CLAIM = """
SELECT id, aggregate_type, aggregate_id, event_type, payload, created_at, retry_count
FROM bench_seed.outbox_events
WHERE status = 'PENDING'
ORDER BY created_at
LIMIT 100
FOR UPDATE SKIP LOCKED
"""


def messages(count: int, queue: str) -> list[dramatiq.Message[Any]]:
    """Dramatiq messages shaped like the outbox rows the relay publishes."""
    return [
        dramatiq.Message(
            queue_name=queue,
            actor_name=f"{queue}.record",
            args=({"order_id": str(uuid.uuid4()), "amount_cents": i, "sent_at": "2026-01-01 00:00:00+00"},),
            kwargs={},
            options={"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"},
            message_id=str(uuid.uuid4()),
        )
        for i in range(count)
    ]


def dramatiq_enqueue_rate(broker_url: str, queue: str, count: int) -> float:
    """Messages per second through Dramatiq's own ``broker.enqueue``."""
    broker = broker_from_url(broker_url)
    broker.declare_queue(queue)
    batch = messages(count, queue)
    broker.enqueue(batch[0])  # connected, queue declared
    started = time.perf_counter()
    for message in batch[1:]:
        broker.enqueue(message)
    rate = (count - 1) / (time.perf_counter() - started)
    with contextlib.suppress(NotImplementedError):  # a Kafka topic cannot be flushed; it goes with the run
        broker.flush(queue)
    broker.close()
    return rate


def raw_pika_rate(amqp_url: str, queue: str, count: int, batch: int = 100) -> float:
    """Messages per second from pika alone: ``batch`` publishes, then wait for all their confirms."""
    declaring = broker_from_url(amqp_url)
    declaring.declare_queue(queue, ensure=True)  # with Dramatiq's arguments
    bodies = [m.encode() for m in messages(count, queue)]
    properties = pika.BasicProperties(delivery_mode=2)
    state: dict[str, Any] = {"sent": 0, "outstanding": set(), "tag": 0}

    def publish_batch(channel: Any) -> None:
        for body in bodies[state["sent"] : state["sent"] + batch]:
            channel.basic_publish("", queue, body, properties)
            state["tag"] += 1
            state["outstanding"].add(state["tag"])
        state["sent"] = min(state["sent"] + batch, count)

    def on_confirm(frame: Any) -> None:
        tag, outstanding = frame.method.delivery_tag, state["outstanding"]
        outstanding.difference_update([t for t in outstanding if t <= tag] if frame.method.multiple else [tag])
        if not outstanding:
            if state["sent"] < count:
                publish_batch(state["channel"])
            else:
                state["done"] = time.perf_counter()
                connection.close()

    def on_channel(channel: Any) -> None:
        state["channel"] = channel
        channel.confirm_delivery(on_confirm, callback=lambda _f: start(channel))

    def start(channel: Any) -> None:
        state["started"] = time.perf_counter()
        publish_batch(channel)

    connection = pika.SelectConnection(
        pika.URLParameters(amqp_url),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda *_: connection.ioloop.stop(),
    )
    connection.ioloop.start()
    declaring.flush(queue)
    declaring.close()
    return count / (state["done"] - state["started"])


def seed_relay_rate(dsn: str, amqp_url: str, queue: str, rows: int, *, sleep: bool) -> float:
    """Rows per second drained by the seed's relay (``sleep``: with its 500 ms ticker)."""
    broker = broker_from_url(amqp_url)  # Dramatiq's RabbitMQ broker with confirm_delivery
    broker.declare_queue(queue)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_SEED_SCHEMA)  # type: ignore[arg-type]
        conn.execute(_SEED_FILL, {"rows": rows})  # type: ignore[arg-type]
        started = time.perf_counter()
        tick = started
        while _seed_batch(conn, broker, queue):
            if sleep:  # Go's time.Ticker: the next tick is 500 ms after the last, if still ahead
                tick += 0.5
                time.sleep(max(0.0, tick - time.perf_counter()))
        rate = rows / (time.perf_counter() - started)
        conn.execute("DROP SCHEMA bench_seed CASCADE")
    broker.flush(queue)
    broker.close()
    return rate


def _seed_batch(conn: psycopg.Connection[Any], broker: dramatiq.Broker, queue: str) -> int:
    with conn.transaction():
        events: Sequence[Any] = conn.execute(_SEED_CLAIM).fetchall()
        for event_id, _type, aggregate_id, event_type, payload, _created, _retries in events:
            broker.enqueue(
                dramatiq.Message(
                    queue_name=queue,
                    actor_name=f"{queue}.record",
                    args=(json.loads(json.dumps(payload)),),
                    kwargs={},
                    options={"aggregate_id": aggregate_id, "event_type": event_type},
                    message_id=str(event_id),
                )
            )
            conn.execute(
                "UPDATE bench_seed.outbox_events SET status = 'PUBLISHED', published_at = NOW() WHERE id = %s",
                (event_id,),
            )
    return len(events)
