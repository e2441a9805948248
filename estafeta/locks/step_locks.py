"""Locks that serialise steps on the same key (an order id, say).

A step declared with ``lock=`` takes its lock inside its transaction, after the inbox
check and only if the message is new (a duplicate is answered without waiting for the
lock's holder), and keeps it until the transaction has ended. The backend is chosen by
``ESTAFETA_LOCK_URL``:

- ``postgres``: ``pg_advisory_xact_lock`` in the step's own transaction, in the inbox
  record's statement (``record_inbox_and_lock`` in ``sql/queries.sql``). It dies with the
  transaction (commit, rollback, a killed worker, ``pg_terminate_backend``), so it can
  never be held by someone who stopped working; no token is needed.
- ``redis://...``: a lease on one Redis server or a Redlock quorum, whose fencing token
  PostgreSQL checks (:mod:`estafeta_sql.fences`), so a holder paused past its lease is rolled back
  instead of writing beside its successor.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import attrs
import psycopg

from estafeta.app.settings import Settings
from estafeta.locks.redis_lease import RedisLock, Redlock
from estafeta_sql import fences
from estafeta_sql.errors import LockNotAcquired, StaleFencingToken
from estafeta_sql.pool import Database

logger = logging.getLogger(__name__)


class HeldLock(Protocol):
    """A lock a step holds."""

    @property
    def token(self) -> int | None:
        """The fencing token of this acquisition (``None`` for locks that need none)."""

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        """Raise if the lock was lost and the transaction must roll back."""


class LockBackend(Protocol):
    """Where locks live."""

    def hold(
        self, conn: psycopg.Connection[Any], key: str, *, schema: str, dsn: str
    ) -> contextlib.AbstractContextManager[HeldLock]:
        """Take the lock on ``key`` for ``conn``'s transaction; released after the block ends.

        ``conn`` is in a transaction on the database ``dsn``; ``schema`` is the service
        schema whose tables the transaction writes (and whose ``fences`` table guards them).
        Raises :class:`LockNotAcquired` when the lock is not obtained within the timeout.
        """

    def close(self) -> None:
        """Release connections."""


@attrs.define
class _TransactionLock:
    token: int | None = None

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        # A transaction-scoped lock cannot be lost while the transaction lives.
        return None


class PostgresLocks:
    """``pg_advisory_xact_lock`` on a hash of the key, bounded by ``lock_timeout``.

    Released by commit or rollback, so a killed worker never leaves one behind, and no
    session state is involved, so it works through a transaction-mode pooler. The
    ``lock_timeout`` stays set for the rest of the transaction: the step's own row locks
    are bounded by it too. Keys are hashed to 64 bits; two keys that collide only
    serialise each other.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms

    def statement(self, key: str) -> tuple[str, tuple[str, str]]:
        """The one statement that sets the ``lock_timeout`` and takes the lock on ``key`` (for :meth:`hold`).

        A step takes the same lock (the same hash of the same key) in its inbox statement,
        ``record_inbox_and_lock``, for a new message only.
        """
        # The volatile subquery is not flattened: the timeout is set before the lock is waited for.
        return (
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
            " FROM (SELECT set_config('lock_timeout', %s, true)) AS timeout",
            (key, f"{self.timeout_ms}ms"),
        )

    def held(self) -> HeldLock:
        """What a step holds once :meth:`statement` ran in its transaction."""
        return _TransactionLock()

    @contextlib.contextmanager
    def hold(self, conn: psycopg.Connection[Any], key: str, *, schema: str = "", dsn: str = "") -> Iterator[HeldLock]:
        conn.execute(*self.statement(key))
        yield self.held()

    def close(self) -> None:
        return None


@attrs.define
class _FencedLock:
    lease: RedisLock
    schema: str
    timeout_ms: int

    @property
    def token(self) -> int:
        return self.lease.token

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        fences.check(conn, self.schema, self.lease.key, self.lease.token, lock_timeout_ms=self.timeout_ms)


class RedisLocks:
    """Redis leases (one server or a Redlock quorum) fenced by PostgreSQL.

    Holding a key: acquire the lease; record its token in ``<schema>.fences`` in a short
    transaction of its own (committed before the step reads anything); yield; the step
    calls ``before_commit``, which checks the token is still the newest, as the last
    statement before its commit. A holder paused past its lease is then rolled back if a
    successor started meanwhile, and a successor never reads what a stale holder is about
    to commit (see :mod:`estafeta_sql.fences`). The lease is released after the transaction ended.
    """

    def __init__(self, redlock: Redlock, *, ttl_ms: int, timeout_ms: int, pool_size: int = 4) -> None:
        self.redlock = redlock
        self.ttl = ttl_ms / 1000
        self.timeout_ms = timeout_ms
        self.pool_size = pool_size
        # Tokens are recorded on connections of their own: the step's connection is inside
        # its transaction, and borrowing from the step pool while holding one of its
        # connections could starve it (every thread waiting for a second connection).
        self._fence_pools: dict[str, Database] = {}
        self._mutex = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisLocks:
        """The backend for ``settings.lock_url`` (one or more ``redis://`` URLs)."""
        return cls(
            Redlock.from_url(settings.lock_url),
            ttl_ms=settings.lock_ttl_ms,
            timeout_ms=settings.lock_timeout_ms,
            pool_size=settings.pool_size,
        )

    @contextlib.contextmanager
    def hold(self, conn: psycopg.Connection[Any], key: str, *, schema: str, dsn: str) -> Iterator[HeldLock]:
        lease = self._acquire_fenced(key, schema, dsn)
        try:
            yield _FencedLock(lease, schema, self.timeout_ms)
        finally:
            if not lease.release():
                logger.warning("lock %r (token %d) had expired before its release", key, lease.token)

    def _acquire_fenced(self, key: str, schema: str, dsn: str) -> RedisLock:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            lease = self.redlock.acquire(key, self.ttl, max(0.0, deadline - time.monotonic()))
            try:
                newer = self.record_token(dsn, schema, key, lease.token)
            except BaseException:
                lease.release()
                raise
            if newer is None:
                return lease
            # The fence has seen a larger token than the servers handed out (a server lost
            # its counters): move the counters past it and try again.
            lease.release()
            self.redlock.advance_tokens(key, newer)
            if time.monotonic() >= deadline:
                raise StaleFencingToken(f"lock {key!r}: token {lease.token} is older than {newer} in {schema}.fences")

    def record_token(self, dsn: str, schema: str, key: str, token: int) -> int | None:
        """Record ``token`` in ``<schema>.fences``; ``None`` if accepted, else the newer token there."""
        with self._fence_database(dsn).connection() as fence_conn:
            return fences.advance(fence_conn, schema, key, token, lock_timeout_ms=self.timeout_ms)

    def _fence_database(self, dsn: str) -> Database:
        with self._mutex:
            database = self._fence_pools.get(dsn)
            if database is None:
                database = self._fence_pools[dsn] = Database(dsn, max_size=self.pool_size)
            return database

    def close(self) -> None:
        with self._mutex:
            for database in self._fence_pools.values():
                database.close()
            self._fence_pools.clear()
        self.redlock.close()


def backend_from_url(settings: Settings) -> LockBackend:
    """The lock backend for ``settings.lock_url``."""
    if settings.lock_url == "postgres":
        return PostgresLocks(settings.lock_timeout_ms)
    return RedisLocks.from_settings(settings)


__all__ = ["HeldLock", "LockBackend", "LockNotAcquired", "PostgresLocks", "RedisLocks", "StaleFencingToken"]
