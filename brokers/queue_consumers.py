"""Who consumes a queue now, asked of the broker itself.

What each broker can say differs, so the answer says what it counted (:class:`Counted`):

- RabbitMQ: the queue's consumers (a passive ``queue.declare``'s ``consumer_count``, no
  management plugin needed): a ``dramatiq`` worker process holds one per queue it consumes,
  whatever its thread count. A queue that does not exist has none.
- Redis: Dramatiq keeps no consumers per queue. It keeps one heartbeat per process (per
  broker instance) that fetched, acknowledged or enqueued on the namespace; a worker, idle or
  busy, beats at least every second or so. So the answer is the processes that beat in the
  last :data:`RECENT_MS`, on any queue of the namespace, relays and other producers included.
- The StubBroker and Kafka: unknown.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import attrs
import dramatiq

#: How recent a Redis heartbeat must be to count its process as there now, in milliseconds.
RECENT_MS = 10_000


class Counted(enum.Enum):
    """What a consumer count counts."""

    #: Consumers of this queue (RabbitMQ).
    QUEUE = "queue"
    #: Processes active on the broker's namespace, on any queue (Redis).
    NAMESPACE = "namespace"
    #: Nothing: the broker cannot tell.
    UNKNOWN = "unknown"


@attrs.frozen
class Consumers:
    """The consumers the broker knows of for one queue."""

    #: How many (``None``: unknown).
    count: int | None
    #: What ``count`` counts.
    counted: Counted

    def describe(self) -> str:
        """One phrase for an operator: ``2``, ``3 processes on the namespace``, ``unknown``."""
        if self.count is None:
            return "unknown"
        if self.counted is Counted.NAMESPACE:
            return f"{self.count} process(es) on the namespace"
        return str(self.count)


def queue_consumers(broker: dramatiq.Broker, queue_name: str) -> Consumers:
    """The consumers of ``queue_name`` (see the module's docstring).

    Raises the broker client's own error when the broker cannot be reached.
    """
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.brokers.redis import RedisBroker

    if isinstance(broker, RabbitmqBroker):
        return Consumers(_rabbitmq_consumers(broker, queue_name), Counted.QUEUE)
    if isinstance(broker, RedisBroker):
        return Consumers(_redis_processes(broker), Counted.NAMESPACE)
    return Consumers(None, Counted.UNKNOWN)


def _rabbitmq_consumers(broker: Any, queue_name: str) -> int:
    import pika.exceptions

    try:
        frame = broker.channel.queue_declare(queue_name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        del broker.channel  # RabbitMQ closed it
        if exc.reply_code == 404:  # NOT_FOUND: nobody declared it yet
            return 0
        raise
    return int(frame.method.consumer_count)


def _redis_processes(broker: Any) -> int:
    since = int(time.time() * 1000) - RECENT_MS
    return int(broker.client.zcount(f"{broker.namespace}:__heartbeats__", since, "+inf"))
