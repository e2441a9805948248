"""A duplicate delivery never waits for its step's lock, on every lock backend.

A delivery whose inbox record has committed is a duplicate: it is answered in its first
round trip, takes no lock and counts no delivery, whoever holds the step's key. A copy
delivered while another delivery of the same message is still in its transaction waits
for that transaction (it cannot know before whether it will commit), at most the lock
timeout: then it is a duplicate, or, if the other is still running, it fails with
``LockNotAcquired`` without counting a delivery and Dramatiq retries it.

Real PostgreSQL and Redis; the lock is held by a real second transaction (``holding``), and
a delivery in flight is held inside its step by a row lock the test takes.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from estafeta import Runtime, deliver
from estafeta_sql.errors import LockNotAcquired

from .helpers import as_rabbitmq_delivers, message_for, scalar, wait_until
from .lock_steps import Charge, charges, open_account
from .test_locks import CHARGE, holding, lock_runtime


def attempts_recorded(conn: psycopg.Connection[Any]) -> int:
    """Delivery counts the probe service holds (a finished delivery leaves none)."""
    return int(scalar(conn, "SELECT count(*) FROM probe.inbox_attempts"))


def effect_once(conn: psycopg.Connection[Any]) -> None:
    """The order was charged by exactly one delivery."""
    assert charges(conn) == 1
    assert scalar(conn, "SELECT count(*) FROM probe.test_charges") == 1
    assert scalar(conn, "SELECT balance_cents FROM probe.test_accounts") == 900


def test_a_duplicate_is_answered_while_another_transaction_holds_the_orders_lock(
    runtime: Runtime, lock_tables: str, lock_url: str, conn: psycopg.Connection[Any]
) -> None:
    # More copies than ESTAFETA_MAX_DELIVERIES allows: none of them counts as a delivery.
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=5000, max_deliveries=2)
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    message = message_for(CHARGE.actor_name, Charge(order_id))
    try:
        assert deliver(CHARGE, rt, message) == "ok"
        with holding(rt, lock_tables, f"order:{order_id}"):
            # Answered inside this block: while the key's lock is held by someone else.
            outcomes = [deliver(CHARGE, rt, message) for _ in range(3)]
        assert outcomes == ["duplicate"] * 3
        effect_once(conn)
        assert attempts_recorded(conn) == 0
        assert scalar(conn, "SELECT count(*) FROM probe.dead_letters") == 0
    finally:
        rt.close()


@contextlib.contextmanager
def account_row_locked(dsn: str, order_id: uuid.UUID) -> Iterator[None]:
    """Hold the order's account row: a charge in flight blocks on it, inside its step, holding its lock."""
    with psycopg.connect(dsn) as blocker:
        blocker.execute("SELECT 1 FROM probe.test_accounts WHERE order_id = %s FOR UPDATE", (order_id,))
        yield
        blocker.rollback()


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    """Sessions of this run's database waiting for a heavyweight lock (a row, a transaction, an advisory lock)."""
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
    )


def in_thread(fn: Callable[[], str]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` in a thread; its outcome (or the exception it raised) lands in the list."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fn())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def original_in_flight(
    rt: Runtime, conn: psycopg.Connection[Any], message: Any
) -> tuple[threading.Thread, list[object]]:
    """Deliver ``message`` in a thread and return once it waits inside its step (its lock and inbox row held)."""
    original = in_thread(lambda: deliver(CHARGE, rt, message))
    wait_until(lambda: lock_waiters(conn) == 1, what="the original delivery to block inside its step")
    return original


def test_a_copy_delivered_while_the_original_is_in_flight_is_a_duplicate_once_it_commits(
    runtime: Runtime, lock_tables: str, lock_url: str, conn: psycopg.Connection[Any]
) -> None:
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=20_000)
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    message = message_for(CHARGE.actor_name, Charge(order_id))
    try:
        with account_row_locked(lock_tables, order_id):
            original, first = original_in_flight(rt, conn, message)
            copy, second = in_thread(lambda: deliver(CHARGE, rt, message))
            # The copy waits for the original's transaction: it cannot know before whether it commits.
            wait_until(lambda: lock_waiters(conn) == 2, what="the copy to wait for the original")
        original.join(20)
        copy.join(20)
        assert (first, second) == (["ok"], ["duplicate"])
        effect_once(conn)
        assert attempts_recorded(conn) == 0
    finally:
        rt.close()


def test_a_copy_waits_for_an_original_in_flight_at_most_the_lock_timeout_and_counts_no_delivery(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    # The original runs on a worker with a long lock timeout, the copy on one with a short one.
    slow = lock_runtime(lock_tables, "postgres", lock_timeout_ms=20_000)
    quick = lock_runtime(lock_tables, "postgres", lock_timeout_ms=200)
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    message = message_for(CHARGE.actor_name, Charge(order_id))
    try:
        with account_row_locked(lock_tables, order_id):
            original, first = original_in_flight(slow, conn, message)
            copy, second = in_thread(lambda: deliver(CHARGE, quick, message))
            wait_until(lambda: not copy.is_alive(), timeout=10, what="the copy to give up waiting for the original")
            assert len(second) == 1 and isinstance(second[0], LockNotAcquired)
            # Only the original's delivery is counted (its own uncommitted transaction forgets it).
            assert scalar(conn, "SELECT attempts FROM probe.inbox_attempts") == 1
        original.join(20)
        assert first == ["ok"]
        assert deliver(CHARGE, quick, message) == "duplicate"
        effect_once(conn)
        assert attempts_recorded(conn) == 0
    finally:
        slow.close()
        quick.close()


def test_a_first_delivery_on_rabbitmq_waits_for_a_copy_in_flight_at_most_the_lock_timeout_and_counts_nothing(
    runtime: Runtime, lock_tables: str, lock_url: str, conn: psycopg.Connection[Any]
) -> None:
    # Two copies of one message (a relay that published it twice), each a first delivery on
    # RabbitMQ: neither is counted, and the inbox insert that replaces the count's wait is
    # bounded by the lock timeout just the same.
    slow = lock_runtime(lock_tables, lock_url, lock_timeout_ms=20_000)
    quick = lock_runtime(lock_tables, lock_url, lock_timeout_ms=200)
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    message = message_for(CHARGE.actor_name, Charge(order_id))
    try:
        with account_row_locked(lock_tables, order_id):
            original = in_thread(lambda: deliver(CHARGE, slow, as_rabbitmq_delivers(message, redelivered=False)))
            wait_until(lambda: lock_waiters(conn) == 1, what="the original delivery to block inside its step")
            copy, second = in_thread(lambda: deliver(CHARGE, quick, as_rabbitmq_delivers(message, redelivered=False)))
            wait_until(lambda: not copy.is_alive(), timeout=10, what="the copy to give up waiting for the original")
            assert len(second) == 1 and isinstance(second[0], LockNotAcquired)
            assert attempts_recorded(conn) == 0
        original[0].join(20)
        assert original[1] == ["ok"]
        assert deliver(CHARGE, quick, as_rabbitmq_delivers(message, redelivered=False)) == "duplicate"
        effect_once(conn)
        assert attempts_recorded(conn) == 0
    finally:
        slow.close()
        quick.close()
