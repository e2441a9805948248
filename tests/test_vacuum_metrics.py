"""The vacuum gauges of the outbox, inbox and inbox_attempts tables (seed 000: watch autovacuum on the outbox).

Dead tuples come from deleting rows, as the relay does for every message it publishes.
Autovacuum is turned off for the outbox during the test, so the dead tuples stay until the
test's own VACUUM and the counts are exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import conninfo

from estafeta import Runtime
from estafeta.observability.table_metrics import TablesCollector
from estafeta_brokers.outboxes import Outbox
from estafeta_sql.pool import Database

Gauges = dict[tuple[str, tuple[str, ...]], float]


def _gauges(outboxes: list[Outbox]) -> Gauges:
    registry = CollectorRegistry()
    registry.register(TablesCollector(outboxes, [], 60))
    return {
        (sample.name, tuple(sample.labels.values())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("estafeta_table_")
    }


def _within(seconds: float, read: Callable[[], Gauges], until: Callable[[Gauges], bool]) -> Gauges:
    """Read until ``until`` holds (statistics reach the views within a second or two of a commit)."""
    deadline = time.monotonic() + seconds
    while True:
        found = read()
        if until(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture
def no_autovacuum_on_orders_outbox(conn: psycopg.Connection[Any]) -> Iterator[None]:
    conn.execute("ALTER TABLE orders.outbox SET (autovacuum_enabled = false)")
    yield
    conn.execute("ALTER TABLE orders.outbox RESET (autovacuum_enabled)")


def test_dead_tuples_and_last_autovacuum_of_each_churning_table_are_gauges(
    runtime: Runtime, conn: psycopg.Connection[Any], no_autovacuum_on_orders_outbox: None
) -> None:
    conn.execute(
        "INSERT INTO orders.outbox (message_id, queue_name, actor_name, message)"
        " SELECT gen_random_uuid(), 'q', 'a', '{}' FROM generate_series(1, 3000)"
    )
    conn.execute("DELETE FROM orders.outbox")  # what the relay does once the broker confirmed them
    conn.execute("SELECT pg_stat_force_next_flush()")  # else an idle session reports within 10 s
    outboxes = [Outbox("orders", runtime.database("orders")), Outbox("payments", runtime.database("payments"))]
    dead = ("estafeta_table_dead_tuples", ("orders", "outbox"))
    gauges = _within(15, lambda: _gauges(outboxes), lambda g: g.get(dead, 0) >= 3000)
    assert gauges[dead] >= 3000  # at least: a session of an earlier test may report late
    for service in ("orders", "payments"):
        for table in ("outbox", "inbox", "inbox_attempts"):
            assert ("estafeta_table_dead_tuples", (service, table)) in gauges
            vacuumed = gauges[("estafeta_table_last_autovacuum_timestamp_seconds", (service, table))]
            row = conn.execute(
                "SELECT coalesce(extract(epoch FROM last_autovacuum), 0)::float8 FROM pg_stat_user_tables"
                " WHERE schemaname = %s AND relname = %s",
                (service, table),
            ).fetchone()
            assert row is not None and vacuumed == pytest.approx(row[0])
    conn.execute("VACUUM orders.outbox")
    gauges = _within(15, lambda: _gauges(outboxes), lambda g: g.get(dead) == 0)
    assert gauges[dead] == 0


def test_a_service_whose_database_is_unreachable_costs_only_its_own_samples(
    runtime: Runtime, database_url: str
) -> None:
    unreachable = conninfo.make_conninfo(database_url, dbname="estafeta_no_such_database")
    broken = Database(unreachable, min_size=0, max_size=1, timeout=1)
    try:
        gauges = _gauges([Outbox("payments", broken), Outbox("orders", runtime.database("orders"))])
    finally:
        broken.close()
    assert ("estafeta_table_dead_tuples", ("orders", "outbox")) in gauges
    assert not any(labels[0] == "payments" for _, labels in gauges)
