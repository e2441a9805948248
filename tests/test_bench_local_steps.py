"""``bench.sagas``'s ``rabbitmq-local`` and ``ho-local-nohistory`` rows: the orders service's own steps run locally.

Their ``dramatiq`` workers import ``bench.actors_local_steps`` (and
``bench.actors_local_without_history``, with hand-offs and without the order's history):
every saga runs to its end and its effects reconcile, and neither ``ConfirmOrder`` nor
``CancelOrder`` is ever delivered (no inbox record of theirs) while their effects are
there. Real worker and relay processes on RabbitMQ, so heavy.
"""

from __future__ import annotations

import random

import psycopg
import pytest

from bench.sagas import _migrate, no_history_harness, process_harness
from estafeta_actors.order_saga import ORDER_SAGA, place_order, reconcile
from estafeta_cli.seed import plan_orders, seed_services

from .helpers import scalar, wait_until
from .services import RUN_ID, rabbitmq_vhost, scratch_database

pytestmark = pytest.mark.heavy

ORDERS = 12


@pytest.mark.parametrize("history", [True, False], ids=["rabbitmq-local", "ho-local-nohistory"])
def test_the_local_steps_rows_end_every_saga_without_sending_the_orders_services_commands(history: bool) -> None:
    with scratch_database() as dsn, rabbitmq_vhost(f"{RUN_ID}-local-{history}") as amqp:
        _migrate(dsn)
        if history:
            harness = process_harness(dsn, amqp, 1, 4, 1, {}, "bench.actors_local_steps")
        else:
            settings = {"ESTAFETA_HANDOFFS": "8"}
            harness = no_history_harness(dsn, amqp, 1, 4, 1, settings, "bench.actors_local_without_history")
        with harness as runtime:
            plan = plan_orders(ORDERS, prefix="local-", rng=random.Random(3))
            seed_services(runtime, plan.balances, plan.stock)
            order_ids = []
            with runtime.database("orders").transaction() as conn:
                for customer, sku, quantity, amount in plan.orders:
                    placed = place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
                    order_ids.append(placed.order_id)
            with psycopg.connect(dsn, autocommit=True) as conn:
                ended = "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL"
                wait_until(lambda: scalar(conn, ended) == ORDERS, timeout=120, what="every saga ended")
                delivered = dict(
                    conn.execute("SELECT consumer, count(*) FROM orders.inbox GROUP BY consumer").fetchall()
                )
                orders = dict(conn.execute("SELECT status, count(*) FROM orders.orders GROUP BY status").fetchall())
                events = (conn.execute("SELECT count(*) FROM orders.events").fetchone() or [0])[0]
                sagas = dict(conn.execute("SELECT status, count(*) FROM orders.saga_order GROUP BY status").fetchall())
            # Money and stock add up, and (where it is kept) the order's history tells each saga.
            check = reconcile(runtime, order_ids, plan.balances, plan.stock)
    assert not ORDER_SAGA.local_steps, "the benchmark's own process sends them"
    assert check.money_before == check.money_now == check.ledger_now == check.ledger_deposited, check
    assert check.stock_before == check.stock_now and not check.projection_mismatches, check
    # Without the history, the only mismatches are the history's own: it tells nothing.
    assert [m for m in check.mismatches if history or "its history has" not in m] == [], check
    assert set(sagas) == {"completed", "compensated"}, sagas
    assert orders.get("confirmed") and orders.get("cancelled"), orders
    assert "orders.confirm_order" not in delivered and "orders.cancel_order" not in delivered, delivered
    assert delivered["orders.saga_order_reply"] > 0
    assert (events > 0) is history, "the order's history is recorded only in the row that keeps it"
