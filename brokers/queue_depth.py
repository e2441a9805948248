"""How many messages wait on a queue, asked of the broker itself.

What each broker can say differs, so the number is an approximation of "work waiting for a
consumer", documented per broker:

- RabbitMQ: the queue's ready messages (``queue.declare``'s ``message_count``, with the
  queue's own arguments): messages delivered to a consumer and not yet acknowledged are
  not counted, nor are delayed messages (their ``.DQ`` queue) before they fall due.
- Redis: the messages Dramatiq keeps for the queue and its delay queue (``qsize``), which
  counts a message until it is acknowledged: a message a live worker holds counts too.
- The StubBroker: the messages on the in-memory queue.
- Any other broker (Kafka): unknown (``None``).
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker


def waiting_messages(broker: dramatiq.Broker, queue_name: str) -> int | None:
    """Messages waiting on ``queue_name`` (see the module's docstring); ``None`` when the broker cannot tell.

    Raises the broker client's own error when the broker cannot be reached.
    """
    if isinstance(broker, StubBroker):
        queue = broker.queues.get(queue_name)
        return 0 if queue is None else queue.qsize()
    counts = getattr(broker, "get_queue_message_counts", None)
    if counts is not None:  # RabbitMQ
        ready, _delayed, _dead = counts(queue_name)
        return int(ready)
    qsize: Any = getattr(broker, "do_qsize", None)
    if qsize is not None:  # Redis
        return int(qsize(queue_name))
    return None
