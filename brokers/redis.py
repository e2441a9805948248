"""Publishing to Redis a batch at a time: Dramatiq's own enqueue, pipelined.

Dramatiq's ``RedisBroker.enqueue`` runs its ``dispatch`` Lua script once per message,
one round trip each. This publisher queues the same script calls, with the same
arguments and the same message bytes (a fresh ``redis_message_id`` option per publish,
as ``enqueue`` adds), in one ``MULTI``/``EXEC`` pipeline: one round trip per batch, and
unmodified ``dramatiq`` workers consume the result. The transaction also means a batch
cut off by a lost connection before ``EXEC`` enqueued nothing.

Every call goes through the publisher's own client, whose socket timeouts are the relay's
confirm timeout: also the ``maxstack`` script Dramatiq runs once per process before its
first enqueue (on the broker's client, which may have no timeout at all: a Redis that
accepts connections and never answers would hold the relay's first batch forever).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from dramatiq.brokers.redis import DEFAULT_LUA_MAX_STACK, RedisBroker
from dramatiq.common import current_millis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sql.outbox import OutboxRow

from .publish import PublishOutcome, describe, encode, encode_each

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
        self._max_unpack_size: int | None = None

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
        # Each enqueued copy needs an id of its own in Redis (a retried message is
        # enqueued again), exactly as RedisBroker.enqueue does.
        encoded, unencodable = encode_each(rows, _with_redis_id)
        try:
            results = self._execute(encoded) if encoded else []
        except redis.RedisError as exc:
            return PublishOutcome(failed=unencodable, broker_error=f"Redis: {describe(exc)}")
        outcome = PublishOutcome(failed=unencodable)
        for (row, _), result in zip(encoded, results, strict=True):
            if isinstance(result, Exception):
                outcome.failed[row.id] = f"Redis refused the enqueue: {describe(result)}"
            else:
                outcome.confirmed.append(row.id)
        return outcome

    def _unpack_size(self) -> int:
        """What ``RedisBroker._max_unpack_size`` computes, asked through this publisher's client."""
        if self._max_unpack_size is None:
            stack = DEFAULT_LUA_MAX_STACK or int(self.broker.scripts["maxstack"](client=self.client))
            self._max_unpack_size = stack // 2  # half the Lua stack, as Dramatiq does (dramatiq#433)
        return self._max_unpack_size

    def _execute(self, encoded: Sequence[tuple[OutboxRow, tuple[str, bytes]]]) -> list[Any]:
        broker = self.broker
        dispatch = broker.scripts["dispatch"]
        max_unpack_size = self._unpack_size()
        timestamp = current_millis()
        pipe = self.client.pipeline(transaction=True)
        for row, (redis_message_id, body) in encoded:
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
                body,
            ]
            dispatch(keys=[broker.namespace], args=args, client=pipe)
        return list(pipe.execute(raise_on_error=False))

    def close(self) -> None:
        """Close the publisher's connections."""
        self.client.close()


def _with_redis_id(row: OutboxRow) -> tuple[str, bytes]:
    redis_message_id = str(uuid.uuid4())
    return redis_message_id, encode(row, redis_message_id=redis_message_id)
