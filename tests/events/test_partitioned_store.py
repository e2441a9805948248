"""The opt-in partitioned event store (``sql/migrations/_events_partitioned``, seed 000).

The partitioned ``events`` table cannot refuse a second ``(stream_id, version)`` by itself
(its unique index must contain ``recorded_at``): these tests show that it does not, and that
two writers of one stream still conflict, on the ``streams`` row, in real concurrent
transactions; and that the normal event store API appends and reads across partitions.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from estafeta.events.store import NO_STREAM, ConcurrencyConflict, EventStore, ExpectedVersion
from estafeta_sql import migrate

from .event_types import OrderConfirmed, OrderCreated, PaymentReceived, registry
from .support import EventSchema, migrate_events

PARTITIONED = "_events_partitioned"


def _partition(conn: psycopg.Connection[Any], schema: str) -> None:
    """Apply the opt-in migration to an event store schema."""
    migrate.apply(conn, schema, migrate.load([migrate.builtin_directory(PARTITIONED)]))


@pytest.fixture
def partitioned(event_schema: EventSchema) -> EventSchema:
    """The test's event store schema, partitioned, with a partition for the days around now."""
    with event_schema.connect() as conn:
        _partition(conn, event_schema.schema)
        around_now = "FROM (now() - interval '1 day') TO (now() + interval '1 day')"
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES " + around_now).format(
                sql.Identifier(event_schema.schema, "events_now"), sql.Identifier(event_schema.schema, "events")
            )
        )
    return event_schema


def created(order_id: str = "1") -> OrderCreated:
    return OrderCreated(order_id, "c1", 700, "USD")


def test_events_is_partitioned_by_time_and_alone_takes_a_duplicate_stream_version(partitioned: EventSchema) -> None:
    store = EventStore(partitioned.schema, registry)
    schema = sql.Identifier(partitioned.schema)
    with partitioned.connect() as conn:
        store.append(conn, "order-1", [created()])
        kind = conn.execute(
            "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (f"{partitioned.schema}.events",)
        ).fetchone()
        assert kind == ("p",)
        # Bypassing the streams row, the table takes version 1 again: it is the row that guards.
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.events (stream_id, version, event_id, type, schema_version, data)"
                " VALUES ('order-1', 1, %s, 'OrderCreated', 2, '{{}}')"
            ).format(schema),
            (uuid.uuid4(),),
        )
        found = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.events WHERE stream_id = 'order-1' AND version = 1").format(schema)
        ).fetchone()
        assert found == (2,)


@pytest.mark.parametrize("expected", [1, NO_STREAM], ids=["exact-version", "no-stream"])
def test_two_writers_of_one_stream_still_conflict_on_the_partitioned_table(
    partitioned: EventSchema, expected: ExpectedVersion
) -> None:
    """Both expect the same version; the second waits for the first's stream row, then conflicts."""
    store = EventStore(partitioned.schema, registry)
    stream = "order-1" if expected == 1 else "order-2"
    if expected == 1:
        with partitioned.connect() as setup:
            store.append(setup, stream, [created()])
    with partitioned.connect(autocommit=False) as first, partitioned.connect(autocommit=False) as second:
        outcome: dict[str, Any] = {}

        def second_writer() -> None:
            try:
                store.append(second, stream, [PaymentReceived("1", 1)], expected_version=expected)
                outcome["second"] = "appended"
            except ConcurrencyConflict as exc:
                outcome["second"] = exc
            second.rollback()

        store.append(first, stream, [PaymentReceived("1", 2)], expected_version=expected)
        writer = threading.Thread(target=second_writer)
        writer.start()
        _wait_until_blocked(partitioned, second.info.backend_pid)
        first.commit()
        writer.join(timeout=10)
        assert not writer.is_alive()
        assert isinstance(outcome["second"], ConcurrencyConflict), outcome
        versions = [e.version for e in store.read(first, stream)]
        first.commit()
    assert versions == ([1, 2] if expected == 1 else [1])


def _wait_until_blocked(schema: EventSchema, pid: int, within: float = 10) -> None:
    """Until backend ``pid`` waits for a lock (the stream's row, held by the first writer)."""
    deadline = time.monotonic() + within
    with schema.connect() as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row == ("Lock",):
                return
            time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for the stream's row within {within} s")


def test_the_event_store_api_appends_and_reads_across_partitions(partitioned: EventSchema) -> None:
    store = EventStore(partitioned.schema, registry)
    with partitioned.connect() as conn:
        with conn.transaction():
            store.append(conn, "order-1", [created()], expected_version=NO_STREAM)
            store.append(conn, "order-2", [created("2")], expected_version=NO_STREAM)
        store.append(conn, "order-1", [PaymentReceived("1", 700), OrderConfirmed("1")], expected_version=1)
        with pytest.raises(ConcurrencyConflict, match="is at version 3, expected 1"):
            store.append(conn, "order-1", [OrderConfirmed("1")], expected_version=1)
        assert [type(e.event) for e in store.read(conn, "order-1")] == [OrderCreated, PaymentReceived, OrderConfirmed]
        assert [e.version for e in store.read(conn, "order-1", after_version=1)] == [2, 3]
        assert [(e.stream_id, e.version) for e in store.read_all(conn)] == [
            ("order-1", 1),
            ("order-2", 1),
            ("order-1", 2),
            ("order-1", 3),
        ]
        where = conn.execute(
            sql.SQL("SELECT DISTINCT tableoid::regclass::text FROM {}.events").format(
                sql.Identifier(partitioned.schema)
            )
        ).fetchall()
        assert where == [(f"{partitioned.schema}.events_now",)]


def test_the_migration_keeps_the_events_already_stored_and_positions_go_on(event_schema: EventSchema) -> None:
    store = EventStore(event_schema.schema, registry)
    with event_schema.connect() as conn:
        before = store.append(conn, "order-1", [created(), PaymentReceived("1", 700)])
        _partition(conn, event_schema.schema)
        after = store.append(conn, "order-1", [OrderConfirmed("1")], expected_version=2)
        read = store.read(conn, "order-1")
    assert [(e.version, e.position, e.event_id) for e in read[:2]] == [
        (r.version, r.position, r.event_id) for r in before
    ]
    assert after[0].position > before[-1].position and after[0].version == 3


def test_updates_and_deletes_stay_refused_on_every_partition(partitioned: EventSchema) -> None:
    store = EventStore(partitioned.schema, registry)
    with partitioned.connect() as conn:
        store.append(conn, "order-1", [created()])
        for table in ("events", "events_now"):
            with pytest.raises(psycopg.errors.RestrictViolation, match="the event store is append-only"):
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(partitioned.schema, table)))
        with conn.transaction():
            store.allow_rewrite(conn)
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(partitioned.schema, "events")))
        assert store.read(conn, "order-1") == []


@pytest.fixture
def bare_schema(event_schema: EventSchema) -> Iterator[tuple[EventSchema, str]]:
    """A schema of its own with only the messaging tables (no event store), dropped afterwards."""
    schema = f"{event_schema.schema}_bare"
    with event_schema.connect() as conn:
        migrate.apply(conn, schema, migrate.load([migrate.builtin_directory("_common")]))
    yield event_schema, schema
    with event_schema.connect() as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_the_migration_without_an_event_store_says_what_to_do(bare_schema: tuple[EventSchema, str]) -> None:
    event_schema, schema = bare_schema
    with event_schema.connect() as conn, pytest.raises(migrate.MigrationError, match="apply _events first"):
        _partition(conn, schema)
    with event_schema.connect() as conn:
        migrate_events(conn, schema)
        _partition(conn, schema)


def test_the_migration_refuses_a_schema_of_the_eventsourcing_library(bare_schema: tuple[EventSchema, str]) -> None:
    """Its recorders rely on the unique (stream_id, version) that a partitioned table cannot have."""
    event_schema, schema = bare_schema
    with event_schema.connect() as conn:
        directories = [migrate.builtin_directory(name) for name in ("_events", "_eventsourcing")]
        migrate.apply(conn, schema, migrate.load(directories))
        with pytest.raises(migrate.MigrationError, match="eventsourcing library's tables"):
            _partition(conn, schema)
