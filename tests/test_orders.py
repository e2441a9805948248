"""The four order services: each step's business rules, idempotency by status, and placing orders."""

from __future__ import annotations

import threading
import uuid

import pytest

from estafeta import Runtime, deliver
from estafeta_actors import payments
from estafeta_actors.inventory import ReleaseStock, ReserveStock
from estafeta_actors.notifications import NotifyCustomer
from estafeta_actors.order_saga import IdempotencyConflict, place_order
from estafeta_actors.orders import CancelOrder, ConfirmOrder
from estafeta_actors.payments import AccountGone, ChargePayment, RefundPayment
from tests.app import STEPS

from .helpers import message_for, scalar
from .shop import place, seed


def run(runtime: Runtime, actor: str, command: object) -> str:
    """Deliver ``command`` to ``actor`` as a fresh message (a new message id: not an inbox duplicate)."""
    return deliver(STEPS[actor], runtime, message_for(actor, command))


def balance(conn, customer: str = "c1") -> int:
    return int(scalar(conn, "SELECT balance_cents FROM payments.accounts WHERE customer_id = %s", customer))


def available(conn, sku: str = "s1") -> int:
    return int(scalar(conn, "SELECT available FROM inventory.stock WHERE sku = %s", sku))


# -- payments ---------------------------------------------------------------------------


def test_an_order_is_charged_once_however_often_it_is_asked(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {})
    order_id = uuid.uuid4()
    assert run(runtime, "payments.charge_payment", ChargePayment(order_id, "c1", 3_000)) == "ok"
    assert run(runtime, "payments.charge_payment", ChargePayment(order_id, "c1", 3_000)) == "ok"
    assert balance(conn) == 7_000
    assert scalar(conn, "SELECT count(*) FROM payments.payments") == 1


def test_a_charge_beyond_the_balance_is_a_business_failure_that_changes_nothing(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 1_000}, {})
    assert run(runtime, "payments.charge_payment", ChargePayment(uuid.uuid4(), "c1", 3_000)) == "failed"
    assert balance(conn) == 1_000
    # Nothing charged; the refusal is recorded as the order's one decision.
    assert conn.execute("SELECT status, amount_cents FROM payments.payments").fetchall() == [("refused", 0)]
    # Nobody asked for an answer, so the refusal is parked where an operator sees it.
    assert "insufficient funds: customer c1 has 1000 cents" in scalar(conn, "SELECT reason FROM payments.dead_letters")


def test_an_order_is_refunded_once(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {})
    order_id = uuid.uuid4()
    run(runtime, "payments.charge_payment", ChargePayment(order_id, "c1", 3_000))
    assert run(runtime, "payments.refund_payment", RefundPayment(order_id, "c1")) == "ok"
    assert run(runtime, "payments.refund_payment", RefundPayment(order_id, "c1")) == "ok"
    assert balance(conn) == 10_000
    assert scalar(conn, "SELECT status FROM payments.payments") == "refunded"


def test_a_refund_before_the_charge_refuses_the_late_charge(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {})
    order_id = uuid.uuid4()
    assert run(runtime, "payments.refund_payment", RefundPayment(order_id, "c1")) == "ok"
    assert run(runtime, "payments.charge_payment", ChargePayment(order_id, "c1", 3_000)) == "failed"
    assert balance(conn) == 10_000
    assert conn.execute("SELECT status, amount_cents FROM payments.payments").fetchall() == [("refunded", 0)]


def test_a_refund_to_an_account_that_is_gone_is_retried_not_refused(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {})
    order_id = uuid.uuid4()
    run(runtime, "payments.charge_payment", ChargePayment(order_id, "c1", 3_000))
    with conn.transaction():
        assert payments.close_account(conn, "c1") == 7_000  # the account is closed: its money paid out
    with pytest.raises(AccountGone, match="cannot refund 3000 cents"):
        run(runtime, "payments.refund_payment", RefundPayment(order_id, "c1"))
    assert scalar(conn, "SELECT status FROM payments.payments") == "charged"
    # Rolled back, the inbox record too: Dramatiq's retry runs it again.
    assert scalar(conn, "SELECT count(*) FROM payments.inbox WHERE consumer = 'payments.refund_payment'") == 0


# -- inventory --------------------------------------------------------------------------


def test_stock_is_reserved_and_released_once_per_order(runtime: Runtime, conn) -> None:
    seed(runtime, {}, {"s1": 5})
    order_id = uuid.uuid4()
    for _ in range(2):
        assert run(runtime, "inventory.reserve_stock", ReserveStock(order_id, "s1", 2)) == "ok"
    assert available(conn) == 3
    for _ in range(2):
        assert run(runtime, "inventory.release_stock", ReleaseStock(order_id, "s1")) == "ok"
    assert available(conn) == 5


@pytest.mark.parametrize(
    ("stock", "reason"), [({"s1": 1}, "out of stock: 1 of s1 left"), ({}, "unknown SKU s1")], ids=["short", "unknown"]
)
def test_reserving_more_than_there_is_is_a_business_failure(
    runtime: Runtime, conn, stock: dict[str, int], reason: str
) -> None:
    seed(runtime, {}, stock)
    assert run(runtime, "inventory.reserve_stock", ReserveStock(uuid.uuid4(), "s1", 2)) == "failed"
    assert reason in scalar(conn, "SELECT reason FROM inventory.dead_letters")
    assert conn.execute("SELECT status, quantity FROM inventory.reservations").fetchall() == [("refused", 0)]


def test_a_release_before_the_reservation_refuses_the_late_reservation(runtime: Runtime, conn) -> None:
    seed(runtime, {}, {"s1": 5})
    order_id = uuid.uuid4()
    assert run(runtime, "inventory.release_stock", ReleaseStock(order_id, "s1")) == "ok"
    assert run(runtime, "inventory.reserve_stock", ReserveStock(order_id, "s1", 2)) == "failed"
    assert available(conn) == 5


# -- orders and notifications -----------------------------------------------------------


def test_confirming_and_cancelling_are_idempotent_and_exclusive(runtime: Runtime, conn) -> None:
    first = place(runtime, "c1", "s1", 1, 100).order_id
    second = place(runtime, "c1", "s1", 1, 100).order_id
    assert run(runtime, "orders.confirm_order", ConfirmOrder(first)) == "ok"
    assert run(runtime, "orders.confirm_order", ConfirmOrder(first)) == "ok"
    assert run(runtime, "orders.cancel_order", CancelOrder(first)) == "failed"
    assert run(runtime, "orders.cancel_order", CancelOrder(second)) == "ok"
    assert run(runtime, "orders.confirm_order", ConfirmOrder(second)) == "failed"
    statuses = dict(conn.execute("SELECT order_id, status FROM orders.orders").fetchall())
    assert statuses == {first: "confirmed", second: "cancelled"}


def test_a_customer_is_told_once_per_kind_of_news(runtime: Runtime, conn) -> None:
    order_id = uuid.uuid4()
    for kind in ("confirmed", "confirmed", "cancelled"):
        assert run(runtime, "notifications.notify_customer", NotifyCustomer(order_id, "c1", kind)) == "ok"
    assert scalar(conn, "SELECT count(*) FROM notifications.sent") == 2


# -- placing orders ---------------------------------------------------------------------


def test_the_same_idempotency_key_places_one_order(runtime: Runtime, conn) -> None:
    first = place(runtime, "c1", "s1", 2, 3_000, key="checkout-42")
    again = place(runtime, "c1", "s1", 2, 3_000, key="checkout-42")
    assert (again.order_id, again.saga_id, first.placed, again.placed) == (first.order_id, first.saga_id, True, False)
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == 1
    assert scalar(conn, "SELECT count(*) FROM orders.saga_order") == 1
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 1
    with pytest.raises(IdempotencyConflict, match="'checkout-42' was already used for a different order"):
        place(runtime, "c1", "s1", 3, 3_000, key="checkout-42")


def test_concurrent_placements_with_one_key_place_one_order(runtime: Runtime, conn) -> None:
    barrier = threading.Barrier(4)
    results = []

    def attempt() -> None:
        with runtime.database("orders").transaction() as tx:
            barrier.wait()
            results.append(
                place_order(tx, customer_id="c1", sku="s1", quantity=1, amount_cents=100, idempotency_key="k")
            )

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(r.placed for r in results) == [False, False, False, True]
    assert len({r.saga_id for r in results}) == 1
    assert scalar(conn, "SELECT count(*) FROM orders.saga_order") == 1
