"""A charge-like step for the lock tests: read a balance, think, write it back.

Without a lock, two deliveries for the same order both read "not charged" and both
charge: the double charge the locks exist to prevent. ``probe.test_charge`` holds the
order's lock; ``probe.test_charge_unlocked`` is the same function without it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg

from estafeta import BusinessFailure, StepContext
from estafeta.locks.step_locks import HeldLock, RedisLocks

from .probe import SERVICE


@attrs.frozen
class Charge:
    """Charge an order once; later deliveries for the same order change nothing."""

    order_id: uuid.UUID
    amount_cents: int = 100
    #: Milliseconds between reading the balance and writing it back.
    think_ms: int = 0
    #: A file written once the balance was read (lets a test pause the worker right there).
    marker: str | None = None


def order_lock(command: Charge) -> str:
    return f"order:{command.order_id}"


def _charge(ctx: StepContext, command: Charge) -> dict[str, bool]:
    row = ctx.conn.execute(
        "SELECT balance_cents, charged FROM probe.test_accounts WHERE order_id = %s", (command.order_id,)
    ).fetchone()
    if row is None:
        raise BusinessFailure(f"no account for order {command.order_id}")
    balance, charged = row
    if command.marker:
        Path(command.marker).write_text(f"{os.getpid()} {ctx.message_id}")
    time.sleep(command.think_ms / 1000)
    if not charged:
        ctx.conn.execute(
            "UPDATE probe.test_accounts SET balance_cents = %s, charged = true WHERE order_id = %s",
            (balance - command.amount_cents, command.order_id),
        )
    ctx.conn.execute(
        "INSERT INTO probe.test_charges"
        " (order_id, message_id, charged, amount_cents, fencing_token, worker_pid) VALUES (%s, %s, %s, %s, %s, %s)",
        (command.order_id, ctx.message_id, not charged, command.amount_cents, ctx.fencing_token, os.getpid()),
    )
    return {"charged": not charged}


charge = SERVICE.step(Charge, name="test_charge", lock=order_lock)(_charge)
charge_unlocked = SERVICE.step(Charge, name="test_charge_unlocked")(_charge)


def open_account(conn: psycopg.Connection[Any], order_id: uuid.UUID, balance_cents: int = 1000) -> None:
    conn.execute("INSERT INTO probe.test_accounts (order_id, balance_cents) VALUES (%s, %s)", (order_id, balance_cents))


@attrs.define
class _Unfenced:
    token: int | None

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        return None


class UnfencedRedisLocks(RedisLocks):
    """What redsync, redis-py's Lock and pottery give: a lease and nothing else.

    Only for tests that show what fencing prevents: a holder paused past its lease
    writes beside its successor.
    """

    @contextlib.contextmanager
    def hold(self, conn: psycopg.Connection[Any], key: str, *, schema: str, dsn: str) -> Iterator[HeldLock]:
        lease = self.redlock.acquire(key, self.ttl, self.timeout_ms / 1000)
        try:
            yield _Unfenced(lease.token)
        finally:
            lease.release()


def charges(conn: psycopg.Connection[Any]) -> int:
    """How many times an order was charged (committed runs that found it not yet charged)."""
    row = conn.execute("SELECT count(*) FROM probe.test_charges WHERE charged").fetchone()
    return int(row[0]) if row else 0
