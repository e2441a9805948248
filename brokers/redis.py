"""Publishing to Redis a batch at a time: Dramatiq's own enqueue, pipelined.

Dramatiq's ``RedisBroker.enqueue`` runs its ``dispatch`` Lua script once per message,
one round trip each. This publisher queues the same script calls, with the same
arguments and the same message bytes (a fresh ``redis_message_id`` option per publish,
as ``enqueue`` adds), in one ``MULTI``/``EXEC`` pipeline: one round trip per batch, and
unmodified ``dramatiq`` workers consume the result. The transaction also means a batch
cut off by a lost connection before ``EXEC`` enqueued nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sql.outbox import OutboxRow

from .publish import PublishOutcome, describe, encode

logger = logging.getLogger(__name__)

#: The name the relay's connections carry in ``CLIENT LIST``.
CLIENT_NAME = "estafeta-relay"


class RedisPublisher:
    """Enqueues a batch as Dramatiq's Redis broker would, in one pipelined transaction.

    A row is confirmed once ``EXEC`` answered for its script call. A script error on one
    call fails that row only; anything that fails the whole transaction (a lost
    connection, a timeout, out of memory, a read-only replica) leaves every row pending
    and reports the broker unavailable.
    """

    def __init__(self, broker: RedisBroker, client: redis.Redis) -> None:
        self.broker = broker
        self.client = client

    @classmethod
    def for_broker(cls, broker: RedisBroker, *, confirm_timeout: float = 15.0, **_: Any) -> RedisPublisher:
        """A publisher on ``broker``'s server and namespace, whose calls time out after ``confirm_timeout``.

        Its own connection pool: a relay must never wait forever on a hung server, and
        retries belong to the relay (which claims the rows again), not to redis-py.
        """
        pool = broker.client.connection_pool
        kwargs = {
            **pool.connection_kwargs,
            "socket_timeout": confirm_timeout,
            "socket_connect_timeout": confirm_timeout,
            "retry": Retry(NoBackoff(), 0),
            "client_name": CLIENT_NAME,
        }
        client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))
        return cls(broker, client)

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Run Dramatiq's enqueue script for every row in one ``MULTI``/``EXEC``; report per row."""
        if not rows:
            return PublishOutcome()
        try:
            results = self._execute(rows)
        except redis.RedisError as exc:
            return PublishOutcome(broker_error=f"Redis: {describe(exc)}")
        outcome = PublishOutcome()
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, Exception):
                outcome.failed[row.id] = f"Redis refused the enqueue: {describe(result)}"
            else:
                outcome.confirmed.append(row.id)
        return outcome

    def _execute(self, rows: Sequence[OutboxRow]) -> list[Any]:
        broker = self.broker
        dispatch = broker.scripts["dispatch"]
        max_unpack_size = broker._max_unpack_size()  # type: ignore[no-untyped-call]
        timestamp = current_millis()
        pipe = self.client.pipeline(transaction=True)
        for row in rows:
            # Each enqueued copy needs an id of its own in Redis (a retried message is
            # enqueued again), exactly as RedisBroker.enqueue does.
            redis_message_id = str(uuid.uuid4())
            args = [
                "enqueue",
                timestamp,
                row.queue_name,
                broker.broker_id,
                broker.heartbeat_timeout,
                broker.dead_message_ttl,
                broker._should_do_maintenance("enqueue"),
                max_unpack_size,
                redis_message_id,
                encode(row, redis_message_id=redis_message_id),
            ]
            dispatch(keys=[broker.namespace], args=args, client=pipe)
        return list(pipe.execute(raise_on_error=False))

    def close(self) -> None:
        """Close the publisher's connections."""
        self.client.close()
