"""The order saga end to end on the StubBroker: a worker, the relay and the watchdog in this process.

The same checks as the kill tests on RabbitMQ (tests/integration/test_saga_kill.py): every
saga ends completed or compensated, nobody is charged twice, money and stock are conserved.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Watchdog
from estafeta_actors import payments
from estafeta_actors.order_saga import ORDER_SAGA, reconcile
from estafeta_brokers.relay import Relay
from estafeta_cli.demo_harness import DuplicatingPublisher
from estafeta_cli.seed import plan_orders
from estafeta_sql import sagas

from .conftest import make_relay
from .helpers import scalar, wait_until
from .shop import Courier, place, saga, seed


@pytest.fixture
def watching(runtime: Runtime) -> Iterator[Watchdog]:
    """The saga watchdog running in a thread, as in a worker process."""
    watchdog = Watchdog(runtime, [ORDER_SAGA])
    stop = threading.Event()
    thread = threading.Thread(target=watchdog.run, args=(stop, 0.05), daemon=True)
    thread.start()
    yield watchdog
    stop.set()
    thread.join(10)


@pytest.fixture
def duplicating_relay(runtime: Runtime, stub_broker: StubBroker) -> Iterator[tuple[Relay, DuplicatingPublisher]]:
    """A running relay that publishes every third message twice."""
    relay = make_relay(runtime, stub_broker)
    publisher = DuplicatingPublisher(relay.publisher, every=3)
    relay.publisher = publisher
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    yield relay, publisher
    stop.set()
    thread.join(10)


def _ended(conn, count: int) -> bool:
    return scalar(conn, "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL") == count


def test_every_saga_ends_and_money_and_stock_are_conserved_despite_duplicates(
    runtime: Runtime, conn, stub_broker: StubBroker, stub_worker, duplicating_relay, watching: Watchdog
) -> None:
    plan = plan_orders(60, rng=random.Random(11))
    seed(runtime, plan.balances, plan.stock)
    order_ids = [place(runtime, c, s, q, a).order_id for c, s, q, a in plan.orders]
    wait_until(lambda: _ended(conn, len(order_ids)), timeout=60, what="every saga ended")
    check = reconcile(runtime, order_ids, plan.balances, plan.stock)
    assert check.ok, check
    assert set(check.sagas) == {"completed", "compensated"}, check.sagas
    _, publisher = duplicating_relay
    assert publisher.copies > 50
    # Every copy was absorbed: no step ran twice (one payment row per order, at most).
    assert scalar(conn, "SELECT count(*) FROM payments.payments") <= len(order_ids)
    assert scalar(conn, "SELECT count(*) FROM notifications.sent") == len(order_ids)


@pytest.fixture
def later_relay(relay: Relay) -> Iterator[threading.Event]:
    """A relay that starts when the test sets the event (until then the test drives by hand)."""
    start, stop = threading.Event(), threading.Event()

    def run() -> None:
        start.wait()
        relay.run(stop)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield start
    start.set()
    stop.set()
    thread.join(10)


def test_a_compensation_that_keeps_failing_fails_the_saga_until_an_operator_resumes_it(
    runtime: Runtime, conn, stub_broker: StubBroker, stub_worker, later_relay: threading.Event
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=0.5)
    # Drive the saga by hand up to the refund (the stock was short), then lose the account:
    # the refund has nowhere to put the money back.
    Courier(runtime, conn).run(hold=frozenset({"payments.refund_payment"}))
    with conn.transaction():
        payments.close_account(conn, "c1")
    later_relay.set()
    # Dramatiq retries the refund with backoff, then the step parks it; the watchdog sees
    # the dead letter once the deadline passes and gives the saga up with the reason.
    watchdog = Watchdog(runtime, [ORDER_SAGA])
    wait_until(
        lambda: bool(watchdog.check_once()) and saga(conn, placed.saga_id).status == "gave_up",
        timeout=30,
        what="the saga given up",
    )
    row = saga(conn, placed.saga_id)
    assert row.current_step == "charge_payment"
    assert row.last_error is not None
    assert row.last_error.startswith("compensation charge_payment: no reply after 3 attempt(s); the last was parked:")
    # Each attempt: the first delivery and Dramatiq's three retries, then the step parked it.
    assert "payments.refund_payment: failed 4 times, last: AccountGone: cannot refund 3000 cents" in row.last_error
    assert scalar(conn, "SELECT count(*) FROM payments.dead_letters") == 3
    # Nothing after the failed compensation ran: the order is neither cancelled nor notified.
    assert scalar(conn, "SELECT status FROM orders.orders") == "pending"
    assert scalar(conn, "SELECT count(*) FROM notifications.sent") == 0

    # The operator restores the account and resumes the saga: the refund runs as a new command.
    with conn.transaction():
        assert payments.open_accounts(conn, {"c1": 7_000}) == 1  # opened again, with what was paid out
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, placed.saga_id) == "retrying"
    wait_until(lambda: saga(conn, placed.saga_id).status == "compensated", timeout=30, what="compensated")
    assert scalar(conn, "SELECT balance_cents FROM payments.accounts") == 10_000
    assert scalar(conn, "SELECT status FROM orders.orders") == "cancelled"
    timeline = [e.event for e in sagas.timeline(conn, ORDER_SAGA.table, placed.saga_id)]
    assert timeline[-5:] == ["gave_up", "resumed", "undone", "undone", "compensated"]
