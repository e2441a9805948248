"""Locks that serialise steps on the same key (an order id, say).

A step declared with ``lock=`` takes its lock inside its transaction, after the inbox
check, and keeps it until the transaction has ended. The backend is chosen by
``ESTAFETA_LOCK_URL``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import attrs
import psycopg

from .settings import Settings


class HeldLock(Protocol):
    """A lock a step holds."""

    #: The fencing token of this acquisition (``None`` for locks that need none).
    token: int | None

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        """Raise if the lock was lost and the transaction must roll back."""


class LockBackend(Protocol):
    """Where locks live."""

    def hold(self, conn: psycopg.Connection[Any], key: str) -> contextlib.AbstractContextManager[HeldLock]:
        """Take the lock on ``key`` for ``conn``'s transaction; released after the block ends."""

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
    session state is involved, so it works through a transaction-mode pooler.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms

    @contextlib.contextmanager
    def hold(self, conn: psycopg.Connection[Any], key: str) -> Iterator[HeldLock]:
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{self.timeout_ms}ms",))
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
        yield _TransactionLock()

    def close(self) -> None:
        return None


def backend_from_url(settings: Settings) -> LockBackend:
    """The lock backend for ``settings.lock_url``."""
    if settings.lock_url == "postgres":
        return PostgresLocks(settings.lock_timeout_ms)
    raise NotImplementedError("Redis locks are not available yet; set ESTAFETA_LOCK_URL=postgres")
