"""``bench.sagas``'s ``ho-nohistory`` row runs the order saga as DBOS's workflow runs it: without the order's history.

Its ``dramatiq`` workers import ``bench.actors_without_history``: every saga still runs to
its end, and no transition reaches the order's event stream or its projection. Real
worker and relay processes on RabbitMQ, so heavy.
"""

from __future__ import annotations

import random

import psycopg
import pytest

from bench.sagas import _migrate, no_history_harness
from estafeta_actors.order_history import record_transition
from estafeta_actors.order_saga import ORDER_SAGA, place_order
from estafeta_cli.seed import plan_orders, seed_services

from .helpers import scalar, wait_until
from .services import RUN_ID, rabbitmq_vhost, scratch_database

pytestmark = pytest.mark.heavy

ORDERS = 12


def test_the_no_history_row_runs_every_saga_to_its_end_and_records_no_history() -> None:
    with scratch_database() as dsn, rabbitmq_vhost(f"{RUN_ID}-nohistory") as amqp:
        _migrate(dsn)
        with no_history_harness(dsn, amqp, 1, 4, 1, {"ESTAFETA_HANDOFFS": "8"}) as runtime:
            plan = plan_orders(ORDERS, prefix="nohistory-", rng=random.Random(3))
            seed_services(runtime, plan.balances, plan.stock)
            with runtime.database("orders").transaction() as conn:
                for customer, sku, quantity, amount in plan.orders:
                    place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
            with psycopg.connect(dsn, autocommit=True) as conn:
                ended = "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL"
                wait_until(lambda: scalar(conn, ended) == ORDERS, timeout=120, what="every saga ended")
                statuses = dict(
                    conn.execute("SELECT status, count(*) FROM orders.saga_order GROUP BY status").fetchall()
                )
                events = (conn.execute("SELECT count(*) FROM orders.events").fetchone() or [0])[0]
                summary = (conn.execute("SELECT to_regclass('orders.order_summary')").fetchone() or [None])[0]
        assert ORDER_SAGA.on_transition is record_transition, "the benchmark's own process gets its hook back"
    assert set(statuses) <= {"completed", "compensated"} and statuses.get("completed"), statuses
    assert events == 0, "no transition appended to an order's history"
    assert summary is None, "no OrderSummary projector ran"
