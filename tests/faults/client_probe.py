"""A client of one server, driven line by line from stdin, run inside a namespace of the fault harness.

``python -m tests.faults.client_probe postgres|redis|rabbitmq|kafka|kafka-verbose|relay URL``
(``kafka-verbose``: ``kafka`` printing librdkafka's log lines down to INFO, repeats
included), then one command a line; each answer is one JSON line
``{"command", "ok", "seconds", "error"}``. The clients are estafeta's own, configured as
estafeta configures them (``estafeta_sql.pool.Database``, the brokers of ``estafeta_brokers.broker_from_url``
and Dramatiq's consumers on them), so the test measures what a worker or a relay would live
through.

Commands: ``query SQL`` (PostgreSQL: one statement on the pool), ``consume`` (Redis and
RabbitMQ: Dramatiq's consumer of a queue, iterated until it fails or ``seconds`` pass),
``enqueue`` (Kafka: one message, acknowledged), ``ping`` (one round trip, on a connection
opened before when there is one), ``publish N`` (``relay``: the relay's Kafka publisher, one
batch of N outbox rows; the answer's ``detail`` is the outcome).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import signal
import sys
import time
from typing import Any


def _postgres(url: str) -> Any:
    from estafeta_sql.pool import Database

    db = Database(url, min_size=1, max_size=2, timeout=10)

    def run(command: str, argument: str) -> None:
        if command == "query":
            with db.connection() as conn:
                conn.execute(argument).fetchall()
        elif command == "ping":
            with db.connection() as conn:
                conn.execute("SELECT 1")
        else:
            raise ValueError(f"unknown command {command!r}")

    return run


def _broker(url: str) -> Any:
    import dramatiq

    from estafeta_brokers import broker_from_url

    broker = broker_from_url(url)
    broker.declare_queue("probe")

    def run(command: str, argument: str) -> None:
        if command == "consume":
            # Iterate Dramatiq's own consumer (what a worker's consumer thread does) for
            # ``argument`` seconds; a dead connection makes it raise.
            until = time.monotonic() + float(argument or 3600)
            consumer = broker.consume("probe", prefetch=1, timeout=200)
            try:
                while time.monotonic() < until:
                    next(consumer)
            finally:
                with contextlib.suppress(Exception):  # closing a dead connection may fail as well
                    consumer.close()
        elif command == "ping":
            _ping(broker)
        elif command == "enqueue":  # Kafka: produce one message and wait for its acknowledgement
            broker.enqueue(dramatiq.Message(queue_name="probe", actor_name="probe", args=(), kwargs={}, options={}))
        else:
            raise ValueError(f"unknown command {command!r}")

    return run


def _relay(url: str) -> Any:
    """The relay's Kafka publisher: ``publish N`` publishes N new outbox rows as one batch.

    The answer carries the outcome (``confirmed``, ``failed``: the rows charged an attempt,
    ``broker_error``); it is ``ok`` only when Kafka confirmed every row.
    """
    import uuid
    from datetime import UTC, datetime

    from estafeta_brokers.kafka_config import parse_kafka_url
    from estafeta_brokers.kafka_publish import KafkaPublisher
    from estafeta_sql.outbox import OutboxRow

    publisher = KafkaPublisher(parse_kafka_url(url), confirm_timeout=5.0)
    ids = iter(range(1, 1_000_000))

    def row(seq: int) -> OutboxRow:
        message = {"args": [seq], "kwargs": {}, "options": {}}
        return OutboxRow(
            id=seq,
            message_id=uuid.uuid4(),
            queue_name="probe",
            actor_name="probe",
            message=message,
            ordering_key=f"key-{seq % 3}",
            saga_id=None,
            created_at=datetime.now(UTC),
            attempts=0,
        )

    def run(command: str, argument: str) -> dict[str, Any]:
        if command != "publish":
            raise ValueError(f"unknown command {command!r}")
        rows = [row(next(ids)) for _ in range(int(argument or 1))]
        outcome = publisher.publish(rows)
        detail = {"confirmed": len(outcome.confirmed), "failed": outcome.failed, "broker_error": outcome.broker_error}
        if len(outcome.confirmed) != len(rows):
            raise Unconfirmed(detail)
        return detail

    return run


class Unconfirmed(Exception):
    """Not every row of a batch was confirmed; ``args[0]`` is the outcome."""


def _ping(broker: Any) -> None:
    client = getattr(broker, "client", None)
    if client is not None:  # Redis
        client.ping()
    else:  # RabbitMQ: declaring an existing queue is one round trip on the broker's channel
        broker.channel.queue_declare("probe", durable=True, passive=True)


def _say(answer: dict[str, Any]) -> None:
    """Print ``answer`` as one line in one write: stderr shares the pipe, and a log line another
    thread wrote between ``print``'s text and its newline once glued itself to an answer."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a hung client waits
    kind, url = sys.argv[1], sys.argv[2]
    if kind == "kafka-verbose":  # every librdkafka line down to INFO, none held back as a repeat
        import logging

        from estafeta_brokers import kafka_config

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        kafka_config.ClientLog.__init__.__defaults__ = (0.0,)
        kind = "kafka"
    run = _postgres(url) if kind == "postgres" else _relay(url) if kind == "relay" else _broker(url)
    _say({"command": "ready", "ok": True})
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        started = time.monotonic()
        error = None
        detail = None
        try:
            detail = run(command, argument)
        except Unconfirmed as exc:
            detail = exc.args[0]
            error = f"not confirmed: {detail['broker_error'] or detail['failed']}"[:300]
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        answer = {"command": command, "ok": error is None, "seconds": time.monotonic() - started, "error": error}
        if detail is not None:
            answer["detail"] = detail
        _say(answer)


if __name__ == "__main__":
    main()
