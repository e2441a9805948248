"""The benchmark's peers (bench/peer_dbos.py, bench/pgqueuer_jobs.py) do the work they are timed for.

They need the ``bench`` extra (DBOS, pgqueuer), which ``make test-heavy`` installs: without it
these tests skip, and fail under CI. Each starts
worker processes, so both are heavy.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator

import psycopg
import pytest

from bench.sagas import _migrate
from estafeta import Runtime, Settings
from estafeta_actors import ledger, payments
from estafeta_cli.seed import plan_orders

from .services import admin_dsn, require, scratch_database

pytestmark = pytest.mark.heavy
#: Both are in the bench extra, which ``make test-heavy`` installs.
BENCH_EXTRA = all(importlib.util.find_spec(name) is not None for name in ("dbos", "pgqueuer"))


@pytest.fixture(autouse=True)
def _bench_extra() -> None:
    """Skip without the bench extra (fail under CI, where make test-heavy installs it)."""
    require("the bench extra (DBOS, pgqueuer)", BENCH_EXTRA, "pip install -e '.[bench]'")


@pytest.fixture
def bench_database() -> Iterator[str]:
    """A database of the test's own with the order system's tables (the peers add schemas to it)."""
    with scratch_database() as dsn:  # skips (or fails under CI) without PostgreSQL
        _migrate(dsn)
        yield dsn


def test_dbos_order_saga_completes_compensates_and_conserves_money_and_stock(bench_database: str) -> None:
    from bench import peer_dbos

    runtime = Runtime(Settings(database_url=bench_database))
    try:
        found = peer_dbos.dbos_sagas(admin_dsn(), bench_database, runtime, 40, [1])["1"]
    finally:
        runtime.close()
    plan = plan_orders(40, prefix=found["tag"], rng=random.Random(7))
    customers, skus = list(plan.balances), list(plan.stock)
    assert found["errors"] == 0
    assert 0 < found["completed"] < 40, "the refusal mix: some orders complete, some compensate"
    with psycopg.connect(bench_database) as conn:
        audit = ledger.audit(conn, payments.STORE, customers)
        charged = conn.execute(
            "SELECT count(*), coalesce(sum(amount_cents), 0) FROM payments.payments"
            " WHERE customer_id = ANY(%s) AND status = 'charged'",
            (customers,),
        ).fetchone()
        units = conn.execute(
            """WITH reserved AS (SELECT quantity FROM inventory.reservations
                                 WHERE sku = ANY(%(s)s) AND status = 'reserved')
               SELECT (SELECT sum(available) FROM inventory.stock WHERE sku = ANY(%(s)s)),
                      (SELECT count(*) FROM reserved), (SELECT coalesce(sum(quantity), 0) FROM reserved)""",
            {"s": skus},
        ).fetchone()
        statuses = dict(
            conn.execute(
                "SELECT status, count(*) FROM orders.orders WHERE customer_id = ANY(%s) GROUP BY status", (customers,)
            ).fetchall()
        )
        notified = conn.execute(
            "SELECT count(*) FROM notifications.sent WHERE customer_id = ANY(%s)", (customers,)
        ).fetchone()
        projected = ledger.projected_balances(conn, customers)
    assert charged is not None and units is not None and notified is not None
    # Money: the ledger's replay equals the projection, and balances plus charges are what was seeded.
    assert audit.balances == projected
    assert sum(audit.balances.values()) + charged[1] == sum(plan.balances.values()) == audit.deposited
    # Stock: what is left plus what is reserved is what was stocked.
    assert units[0] + units[2] == sum(plan.stock.values())
    # Every confirmed order was charged and reserved once; every other one was cancelled; each was told once.
    assert statuses == {"confirmed": found["completed"], "cancelled": 40 - found["completed"]}
    assert charged[0] == units[1] == found["completed"]
    assert notified[0] == 40


def test_pgqueuer_worker_writes_one_row_per_job(bench_database: str) -> None:
    from bench import peers

    found = peers.pgqueuer_rate(bench_database, 30)
    with psycopg.connect(bench_database) as conn:
        rows = conn.execute("SELECT count(*), min(id), max(id) FROM peer_writes").fetchone()
    assert rows == (30, 0, 29)
    assert found["per_second"] > 0
