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
accepts connections and never answers would hold the relay's first batch forever). The
socket timeout bounds each read; a batch makes several (the connection's handshake, its
health check, the script, ``EXEC``, ``WAIT``), so the whole attempt runs against one
deadline, the confirm timeout, in a thread of the publisher's own: past it, the
publisher's connections are closed (which ends the blocked read) and the batch reports
the broker unavailable.
"""

from __future__ import annotations

import concurrent.futures
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from dramatiq.brokers.redis import DEFAULT_LUA_MAX_STACK, RedisBroker
from dramatiq.common import current_millis
from redis.backoff import NoBackoff
from redis.retry import Retry

from estafeta_sql.outbox import OutboxRow

from .batches import PublishOutcome, describe, encode, encode_each

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

    def __init__(self, broker: RedisBroker, client: redis.Redis, *, wait_replicas: int = 0) -> None:
        self.broker = broker
        self.client = client
        #: Replicas that must acknowledge a batch (``WAIT``) before it counts as confirmed.
        self.wait_replicas = wait_replicas
        #: The bound of one batch's whole attempt, seconds (``None``: each read's socket timeout only).
        self.attempt_timeout: float | None = None
        self._wait_ms = 0
        self._max_unpack_size: int | None = None
        self._attempts: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def for_broker(
        cls, broker: RedisBroker, *, confirm_timeout: float = 15.0, wait_replicas: int = 0, **_: Any
    ) -> RedisPublisher:
        """A publisher on ``broker``'s server and namespace, whose calls time out after ``confirm_timeout``.

        Its own connection pool: a relay must never wait forever on a hung server, and
        retries belong to the relay (which claims the rows again), not to redis-py. With
        ``wait_replicas``, a batch counts as confirmed only once that many replicas have
        acknowledged it (``WAIT``, within the confirm timeout).
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
        publisher = cls(broker, client, wait_replicas=wait_replicas)
        publisher.attempt_timeout = confirm_timeout
        # WAIT answers within its own timeout, before the socket's: a late replica is reported, not a hung server.
        publisher._wait_ms = max(int(confirm_timeout * 1000) - 500, 1)
        return publisher

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Run Dramatiq's enqueue script for every row in one ``MULTI``/``EXEC``; report per row."""
        if not rows:
            return PublishOutcome()
        # Each enqueued copy needs an id of its own in Redis (a retried message is
        # enqueued again), exactly as RedisBroker.enqueue does.
        encoded, unencodable = encode_each(rows, _with_redis_id)
        try:
            results, short = self._bounded(lambda: self._attempt(encoded)) if encoded else ([], None)
        except redis.TimeoutError as exc:
            return PublishOutcome(failed=unencodable, broker_error=self._no_answer(describe(exc)))
        except redis.RedisError as exc:
            return PublishOutcome(failed=unencodable, broker_error=f"Redis: {describe(exc)}")
        if short:
            return PublishOutcome(failed=unencodable, broker_error=short)
        outcome = PublishOutcome(failed=unencodable)
        for (row, _), result in zip(encoded, results, strict=True):
            if isinstance(result, Exception):
                outcome.failed[row.id] = f"Redis refused the enqueue: {describe(result)}"
            else:
                outcome.confirmed.append(row.id)
        return outcome

    def _attempt(self, encoded: Sequence[tuple[OutboxRow, tuple[str, bytes]]]) -> tuple[list[Any], str | None]:
        return self._execute(encoded), self._replicas_short()

    def _bounded(self, attempt: Any) -> Any:
        """``attempt()`` within :attr:`attempt_timeout`, or ``redis.TimeoutError`` (its connections closed)."""
        if self.attempt_timeout is None:
            return attempt()
        if self._attempts is None:
            self._attempts = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="estafeta-redis-publish")
        future = self._attempts.submit(attempt)
        try:
            return future.result(timeout=self.attempt_timeout)
        except concurrent.futures.TimeoutError:
            # Closing the sockets ends the read the attempt waits in; its error is dropped.
            self.client.connection_pool.disconnect()
            raise redis.TimeoutError("the attempt was cut off") from None

    def _no_answer(self, detail: str) -> str:
        where = self.client.connection_pool.connection_kwargs
        bound = f"{self.attempt_timeout:g} s" if self.attempt_timeout is not None else "the socket timeout"
        return f"Redis at {where.get('host')}:{where.get('port')}: no answer within {bound} ({detail})"

    def _replicas_short(self) -> str | None:
        """Why the batch just written is not confirmed yet: too few replicas acknowledged it (``WAIT``)."""
        if not self.wait_replicas:
            return None
        acknowledged = int(self.client.wait(self.wait_replicas, self._wait_ms or 1000))
        if acknowledged >= self.wait_replicas:
            return None
        return (
            f"Redis: only {acknowledged} of {self.wait_replicas} replica(s) acknowledged the batch"
            f" within {self._wait_ms} ms (wait={self.wait_replicas}); it stays in the outbox"
        )

    def durability_warning(self) -> str | None:
        """A warning when the Redis published to persists nothing (no append-only file, no snapshots).

        ``None`` when it persists, or when it does not let us ask (``CONFIG`` disabled).
        """
        try:
            appendonly = self.client.config_get("appendonly").get("appendonly")
            save = self.client.config_get("save").get("save")
        except redis.RedisError as exc:
            logger.info("relay: cannot tell whether Redis persists its data (%s)", describe(exc))
            return None
        if appendonly != "no" or save:
            return None
        where = self.client.connection_pool.connection_kwargs
        return (
            f'Redis at {where.get("host")}:{where.get("port")} persists nothing (appendonly no, save ""):'
            " a message the relay has published and deleted from the outbox lives only in Redis's memory"
            " until a worker takes it, and a Redis restart loses it; turn on appendonly"
            " (see docs/operations/hardening.md, 'Redis durability')"
        )

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
        """Close the publisher's connections (and end an attempt still waiting on one)."""
        self.client.connection_pool.disconnect()
        self.client.close()
        if self._attempts is not None:
            self._attempts.shutdown(wait=False)


def _with_redis_id(row: OutboxRow) -> tuple[str, bytes]:
    redis_message_id = str(uuid.uuid4())
    return redis_message_id, encode(row, redis_message_id=redis_message_id)
