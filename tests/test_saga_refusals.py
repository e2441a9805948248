"""A refusal is final: an earlier send of a refused command, retried late, takes no effect.

The race, driven message by message: attempt 1 of a saga command
meets the order's lock held elsewhere (``LockNotAcquired``) and waits in Dramatiq's retry
backoff; the deadline passes and the watchdog sends attempt 2; attempt 2 is refused (no
money, no stock) and the saga compensates; then money or stock arrives (another order's
refund), and attempt 1 is retried. It must be refused too: nothing charged or reserved
for a cancelled order, money and stock conserved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
import pytest

from estafeta import Clock, LockNotAcquired, Runtime, Settings, Watchdog, deliver
from estafeta.testing import VirtualClock
from estafeta_actors import payments
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_actors.payments import ChargePayment
from estafeta_brokers.publish import to_message
from estafeta_sql.outbox import OutboxRow
from tests.app import STEPS
from tests.app import app as tests_app

from .helpers import message_for, scalar
from .shop import Courier, place, saga, seed
from .test_saga import CHARGE, RESERVE, TIMEOUT, available, balance, order_status, overdue

STEP_TIMEOUT = TIMEOUT


@pytest.fixture
def courier(runtime: Runtime, conn) -> Courier:
    return Courier(runtime, conn)


@pytest.fixture
def watchdog(runtime: Runtime) -> Watchdog:
    return Watchdog(runtime, [ORDER_SAGA])


@pytest.fixture
def clock(runtime: Runtime, watchdog: Watchdog) -> VirtualClock:
    """The virtual clock with the watchdog; the Courier delivers by hand, so no relay pass."""
    return VirtualClock(Clock(runtime, tests_app.service_names), watchdog=watchdog)


@contextlib.contextmanager
def lock_held_elsewhere(dsn: str, key: str) -> Iterator[None]:
    """The order's step lock held by another transaction (another worker's step) until the block ends."""
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
        yield
        other.rollback()


def meets_the_lock(dsn: str, row: OutboxRow, key: str) -> None:
    """Deliver ``row`` while its order's lock is taken: ``LockNotAcquired`` (Dramatiq retries it later)."""
    impatient = Runtime(Settings(database_url=dsn, lock_timeout_ms=50))
    try:
        with lock_held_elsewhere(dsn, key), pytest.raises(LockNotAcquired):
            deliver(STEPS[row.actor_name], impatient, to_message(row))
    finally:
        impatient.close()


def resend_after_the_deadline(clock: VirtualClock) -> None:
    assert overdue(clock) == {"resent": 1}


def test_a_charge_retried_after_its_order_was_refused_is_refused_too(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock, database_url: str
) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=STEP_TIMEOUT)
    first = courier.take(CHARGE)
    meets_the_lock(database_url, first, str(placed.order_id))
    resend_after_the_deadline(clock)
    assert courier.deliver(courier.take(CHARGE)) == "failed"  # attempt 2: insufficient funds
    courier.run()
    assert saga(conn, placed.saga_id).status == "compensated"
    assert order_status(conn, placed.order_id) == "cancelled"
    with conn.transaction():
        payments.deposit(conn, "c1", 9_000)  # money came in meanwhile
    assert courier.deliver(first) == "failed"  # Dramatiq's retry of attempt 1, late
    courier.run()
    assert balance(conn) == 10_000
    assert scalar(conn, "SELECT count(*) FROM payments.payments WHERE status = 'charged'") == 0


def test_a_reservation_retried_after_its_order_was_refused_is_refused_too(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock, database_url: str
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=STEP_TIMEOUT)
    courier.run(hold=frozenset({RESERVE}))
    first = courier.take(RESERVE)
    meets_the_lock(database_url, first, str(placed.order_id))
    resend_after_the_deadline(clock)
    assert courier.deliver(courier.take(RESERVE)) == "failed"  # attempt 2: out of stock
    courier.run()
    assert saga(conn, placed.saga_id).status == "compensated"
    conn.execute("UPDATE inventory.stock SET available = 5")  # another order released its stock
    assert courier.deliver(first) == "failed"  # attempt 1, late
    courier.run()
    assert (balance(conn), available(conn)) == (10_000, 5)
    assert scalar(conn, "SELECT count(*) FROM inventory.reservations WHERE status = 'reserved'") == 0
    assert scalar(conn, "SELECT count(*) FROM payments.payments WHERE status = 'charged'") == 0


@pytest.mark.parametrize(
    ("accounts", "reason"),
    [({"c1": 1_000}, "insufficient funds"), ({}, "has no account")],
)
def test_a_refused_charge_is_recorded_as_the_orders_one_decision(
    runtime: Runtime, conn, courier: Courier, accounts: dict[str, int], reason: str
) -> None:
    seed(runtime, accounts, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    status, amount, why = conn.execute("SELECT status, amount_cents, reason FROM payments.payments").fetchone()
    assert (status, amount) == ("refused", 0) and reason in why
    # Any later charge of the order, whatever its message id, gets the same answer.
    again = message_for(CHARGE, ChargePayment(placed.order_id, "c1", 3_000))  # nobody waits: dead-lettered
    assert deliver(STEPS[CHARGE], runtime, again) == "failed"
    assert "was refused" in scalar(conn, "SELECT reason FROM payments.dead_letters")
    assert saga(conn, placed.saga_id).status == "compensated"


def test_a_refused_reservation_is_recorded_as_the_orders_one_decision(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    status, quantity, why = conn.execute("SELECT status, quantity, reason FROM inventory.reservations").fetchone()
    assert (status, quantity) == ("refused", 0) and "out of stock" in why
    assert (balance(conn), available(conn)) == (10_000, 1)


def test_a_refused_step_sent_more_than_once_is_compensated_too(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    # For participants that do not record their refusals: an earlier send may still take
    # effect, so the saga undoes the refused step too (its compensation finds nothing, or
    # undoes what the earlier send did).
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=STEP_TIMEOUT)
    courier.take(CHARGE)  # attempt 1 is somewhere, late
    resend_after_the_deadline(clock)
    assert courier.deliver(courier.take(CHARGE)) == "failed"
    courier.run(hold=frozenset({"payments.refund_payment"}))
    row = saga(conn, placed.saga_id)
    assert row.compensations == ["charge_payment", "place_order", "notify_cancellation"]
    assert row.current_step == "charge_payment"


def test_a_refused_step_sent_again_by_an_operator_is_compensated_too(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.take(CHARGE)  # slow
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, placed.saga_id) == "resent"  # a new version, attempts start over
    assert courier.deliver(courier.take(CHARGE)) == "failed"
    courier.run(hold=frozenset({"payments.refund_payment"}))
    assert saga(conn, placed.saga_id).compensations == ["charge_payment", "place_order", "notify_cancellation"]


def test_a_step_refused_at_its_only_send_is_not_compensated(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    assert saga(conn, placed.saga_id).compensations == ["place_order", "notify_cancellation"]
