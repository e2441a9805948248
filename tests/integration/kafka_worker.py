"""Plain Dramatiq actors on the Kafka broker, served by ``dramatiq tests.integration.kafka_worker``.

The broker contract tests drive it. Every delivery is recorded in PostgreSQL
(``kafkacheck.deliveries``: the message id, its sequence number, this worker run's
``KAFKACHECK_RUN`` label, the Kafka partition and offset), and every success in
``kafkacheck.done``. Environment knobs, all read once at import:

- ``KAFKACHECK_HOLD``: sequence numbers this process takes and never finishes (it sleeps
  until it is killed), so a test can kill it with those messages in flight;
- ``KAFKACHECK_SLOW``: sequence numbers that take ``KAFKACHECK_SLOW_SECONDS`` to finish;
- ``KAFKACHECK_DELIVERY_TIMEOUT``: seconds the worker's producer waits for Kafka's acknowledgement.
"""

from __future__ import annotations

import os
import time

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage

from estafeta_brokers import broker_from_url

broker = broker_from_url(os.environ["ESTAFETA_BROKER_URL"])
if "KAFKACHECK_DELIVERY_TIMEOUT" in os.environ:  # seconds the worker's producer waits for Kafka's ack
    broker.delivery_timeout = float(os.environ["KAFKACHECK_DELIVERY_TIMEOUT"])  # type: ignore[attr-defined]
dramatiq.set_broker(broker)

DSN = os.environ["ESTAFETA_DATABASE_URL"]
RUN = os.environ.get("KAFKACHECK_RUN", "1")
HOLD = {int(seq) for seq in os.environ.get("KAFKACHECK_HOLD", "").split(",") if seq}
SLOW = {int(seq) for seq in os.environ.get("KAFKACHECK_SLOW", "").split(",") if seq}
SLOW_SECONDS = float(os.environ.get("KAFKACHECK_SLOW_SECONDS", "3"))


def _deliver(seq: int) -> int:
    """Record this delivery; return how many deliveries of this message there were, this one included."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO kafkacheck.deliveries (message_id, seq, run, kafka_partition, kafka_offset)"
            " VALUES (%s, %s, %s, %s, %s)",
            (
                message.message_id,
                seq,
                RUN,
                getattr(message, "kafka_partition", None),
                getattr(message, "kafka_offset", None),
            ),
        )
        row = conn.execute("SELECT count(*) FROM kafkacheck.deliveries WHERE message_id = %s", (message.message_id,))
        return int(row.fetchone()[0])  # type: ignore[index]


@dramatiq.actor(
    queue_name="kafkacheck", actor_name="kafkacheck.record", max_retries=2, min_backoff=200, max_backoff=400
)
def record(seq: int, fail_times: int = 0) -> None:
    """Record the delivery; hold, dawdle or fail as the test asked; record the success."""
    attempt = _deliver(seq)
    while seq in HOLD:
        time.sleep(1)
    if seq in SLOW:
        time.sleep(SLOW_SECONDS)
    if fail_times < 0 or attempt <= fail_times:
        raise RuntimeError(f"boom: seq {seq}, attempt {attempt}")
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("INSERT INTO kafkacheck.done (seq, run) VALUES (%s, %s)", (seq, RUN))
