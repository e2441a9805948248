"""Publishing claimed outbox rows through a broker, and reporting what it confirmed.

A publisher gets a batch in id order and reports, per row, whether the broker confirmed
it, refused it (the row's fault: it counts an attempt), or neither (the broker could
not be reached, or the batch was cut short: the row stays pending, no attempt counted).
Publishers never retry on their own; the relay claims the row again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import dramatiq
import dramatiq.errors

from estafeta_sql.outbox import OutboxRow

# What every publisher shares lives in .batches, which the publishers import instead of
# this module (it imports them); its names stay importable from here.
from .batches import PublishOutcome as PublishOutcome
from .batches import after_refusals as after_refusals
from .batches import describe as describe
from .batches import encode as encode
from .batches import encode_each as encode_each

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    """Carries rows to a broker."""

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Publish ``rows`` in order and report which the broker confirmed."""

    def close(self) -> None:
        """Release the broker connection."""


def to_message(row: OutboxRow) -> dramatiq.Message[Any]:
    """The Dramatiq message of an outbox row, with the row's id as its message id."""
    return dramatiq.Message(
        queue_name=row.queue_name,
        actor_name=row.actor_name,
        args=tuple(row.message.get("args", ())),
        kwargs=dict(row.message.get("kwargs", {})),
        options=dict(row.message.get("options", {})),
        message_id=str(row.message_id),
        message_timestamp=int(row.created_at.timestamp() * 1000),
    )


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the broker is unreachable (as opposed to refusing one message)."""
    if isinstance(exc, dramatiq.errors.BrokerConnectionError):
        return True
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a dependency
        return False
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError)


class EnqueuePublisher:
    """Publishes through ``broker.enqueue``, one message at a time.

    Correct on every broker (RabbitMQ brokers built by ``broker_from_url`` wait for each
    publisher confirm), but one round trip per message: the relay uses it for the
    StubBroker, and for brokers it has no batched publisher for.
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        outcome = PublishOutcome()
        stopped_keys: set[str] = set()
        for row in rows:
            if row.ordering_key is not None and row.ordering_key in stopped_keys:
                continue  # an older row of this key failed: keep the order, publish later
            try:
                self.broker.enqueue(to_message(row))
            except Exception as exc:
                if is_connection_error(exc):
                    return attrs.evolve(outcome, broker_error=describe(exc))
                outcome.failed[row.id] = describe(exc)
                if row.ordering_key is not None:
                    stopped_keys.add(row.ordering_key)
            else:
                outcome.confirmed.append(row.id)
        return outcome

    def close(self) -> None:
        self.broker.close()


def durability_warning(publisher: Publisher) -> str | None:
    """What an operator should know at start about where ``publisher``'s confirmed messages live.

    On Redis a confirmed publish is in the server's memory: the warning says so when the
    server persists nothing. RabbitMQ confirms persistent messages once on disk.
    """
    from .redis import RedisPublisher

    return publisher.durability_warning() if isinstance(publisher, RedisPublisher) else None


def publisher_for(broker: dramatiq.Broker, **options: Any) -> Publisher:
    """The fastest correct publisher for ``broker``.

    RabbitMQ: a batch per round trip with publisher confirms outstanding
    (:class:`estafeta_brokers.rabbitmq.RabbitmqPublisher`); Redis: a pipelined batch
    (:class:`estafeta_brokers.redis.RedisPublisher`); a broker with a ``relay_publisher(**options)``
    method (Kafka: :class:`estafeta_brokers.kafka_publish.KafkaPublisher`): that; anything else:
    ``broker.enqueue``.
    ``options`` go to the batched publishers (``confirm_timeout``...).
    """
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.brokers.redis import RedisBroker

    if isinstance(broker, RabbitmqBroker):
        from .rabbitmq import RabbitmqPublisher

        return RabbitmqPublisher.for_broker(broker, **options)
    if isinstance(broker, RedisBroker):
        from .redis import RedisPublisher

        return RedisPublisher.for_broker(broker, **options)
    relay_publisher = getattr(broker, "relay_publisher", None)
    # Such a broker (Kafka's) brings its own, so that its driver is imported only when used.
    if relay_publisher is not None:
        return relay_publisher(**options)  # type: ignore[no-any-return]
    return EnqueuePublisher(broker)
