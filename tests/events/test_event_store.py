"""The event store on real PostgreSQL: appends, optimistic concurrency, atomicity, upcasting, decoding errors."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from estafeta.events.event_types import EventRegistry, EventRegistryError
from estafeta.events.store import (
    ANY,
    NO_STREAM,
    ConcurrencyConflict,
    EventMetadata,
    EventStore,
    InvalidEventData,
    StreamAppend,
    UnknownEventType,
    UnknownSchemaVersion,
)
from estafeta_sql.queries import query

from .event_types import DEFAULT_CURRENCY, OrderConfirmed, OrderCreated, PaymentReceived, registry
from .support import EventSchema


def created(order_id: str = "1", amount: int = 700) -> OrderCreated:
    return OrderCreated(order_id, "c1", amount, "USD")


def raw_insert(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    version: int,
    type_: str,
    schema_version: int,
    data: dict[str, Any],
) -> int:
    """An event written as an older (or newer) release of the code would have, bypassing the store."""
    row = conn.execute(
        sql.SQL(
            "WITH s AS (INSERT INTO {}.streams (stream_id, type, version, last_tx_id)"
            " VALUES (%s, 'order', %s, pg_current_xact_id())"
            " ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version RETURNING 1)"
            " INSERT INTO {}.events (stream_id, version, event_id, type, schema_version, data)"
            " SELECT %s, %s, %s, %s, %s, %s FROM s RETURNING position"
        ).format(sql.Identifier(schema), sql.Identifier(schema)),
        (stream_id, version, stream_id, version, uuid.uuid4(), type_, schema_version, Jsonb(data)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_append_and_read_back_with_metadata(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    store = EventStore(event_schema.schema, registry)
    meta = EventMetadata(
        causation_id="m-1", correlation_id="saga-9", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    )
    with conn.transaction():
        recorded = store.append(
            conn, "order-1", [created(), PaymentReceived("1", 700)], expected_version=NO_STREAM, metadata=meta
        )
    assert [r.version for r in recorded] == [1, 2]
    assert recorded[0].position < recorded[1].position
    events = store.read(conn, "order-1")
    assert [e.event for e in events] == [created(), PaymentReceived("1", 700)]
    assert events[0].metadata == meta
    assert events[0].type == "OrderCreated" and events[0].schema_version == 2
    stream = conn.execute(
        sql.SQL("SELECT type, version FROM {}.streams").format(sql.Identifier(store.schema))
    ).fetchone()
    assert stream == ("order", 2)


def test_expected_version_exact_no_stream_and_any(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    store = EventStore(event_schema.schema, registry)
    store.append(conn, "order-1", [created()], expected_version=0)
    with pytest.raises(ConcurrencyConflict, match="already exists at version 1, expected no stream"):
        store.append(conn, "order-1", [created()], expected_version=NO_STREAM)
    with pytest.raises(ConcurrencyConflict, match="is at version 1, expected 3") as caught:
        store.append(conn, "order-1", [OrderConfirmed("1")], expected_version=3)
    assert caught.value.actual == 1 and caught.value.stream_id == "order-1"
    with pytest.raises(ConcurrencyConflict, match="does not exist, expected version 2"):
        store.append(conn, "order-2", [created("2")], expected_version=2)
    store.append(conn, "order-1", [PaymentReceived("1", 700)], expected_version=1)
    store.append(conn, "order-1", [OrderConfirmed("1")], expected_version=ANY)
    store.append(conn, "order-3", [created("3")], expected_version=ANY)
    assert store.version(conn, "order-1") == 3 and store.version(conn, "order-3") == 1
    assert store.version(conn, "order-2") == 0
    with pytest.raises(ValueError, match="expected_version"):
        store.append(conn, "order-1", [created()], expected_version=-1)


def test_a_conflict_leaves_the_transaction_usable(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    store = EventStore(event_schema.schema, registry)
    store.append(conn, "order-1", [created()])
    with conn.transaction():
        with pytest.raises(ConcurrencyConflict):
            store.append(conn, "order-1", [OrderConfirmed("1")], expected_version=5)
        store.append(conn, "order-2", [created("2")], expected_version=NO_STREAM)
    assert store.version(conn, "order-2") == 1


def test_two_writers_on_one_stream_one_conflicts_then_succeeds_on_the_new_version(event_schema: EventSchema) -> None:
    """Both read version 1; the first to append holds the stream row; the second waits, then conflicts."""
    store = EventStore(event_schema.schema, registry)
    with event_schema.connect() as setup:
        store.append(setup, "order-1", [created()])
    first, second = event_schema.connect(autocommit=False), event_schema.connect(autocommit=False)
    outcome: dict[str, Any] = {}

    def late_writer() -> None:
        try:
            store.append(second, "order-1", [PaymentReceived("1", 1)], expected_version=1)
            outcome["second"] = "appended"
        except ConcurrencyConflict as exc:
            outcome["second"] = exc
        second.rollback()

    store.append(first, "order-1", [PaymentReceived("1", 2)], expected_version=1)
    thread = threading.Thread(target=late_writer)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive(), "the second writer must wait for the first one's stream row"
    first.commit()
    thread.join(timeout=10)
    assert isinstance(outcome["second"], ConcurrencyConflict), outcome
    # Retried as a new attempt (what Dramatiq does for a step), it reads version 2 and succeeds.
    with second.transaction():
        version = store.version(second, "order-1")
        store.append(second, "order-1", [PaymentReceived("1", 1)], expected_version=version)
    assert [e.version for e in store.read(second, "order-1")] == [1, 2, 3]
    first.close()
    second.close()


def test_several_streams_in_one_transaction_are_atomic(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    store.append(conn, "order-2", [created("2")])
    with pytest.raises(ConcurrencyConflict), conn.transaction():
        store.append_streams(
            conn,
            [
                StreamAppend("order-1", [created("1")], NO_STREAM),
                StreamAppend("order-2", [OrderConfirmed("2")], 7),
            ],
        )
    assert store.version(conn, "order-1") == 0, "the first stream's events went with the failed transaction"
    with conn.transaction():
        store.append_streams(
            conn,
            [StreamAppend("order-2", [OrderConfirmed("2")], 1), StreamAppend("order-1", [created("1")], NO_STREAM)],
        )
    assert (store.version(conn, "order-1"), store.version(conn, "order-2")) == (1, 2)


def test_a_transaction_older_than_the_streams_last_writer_conflicts(event_schema: EventSchema) -> None:
    """Projections read in (tx_id, position) order: a stream's events must come in transaction-id order."""
    store = EventStore(event_schema.schema, registry)
    older, newer = event_schema.connect(autocommit=False), event_schema.connect(autocommit=False)
    older.execute("SELECT pg_current_xact_id()")  # the older transaction takes its id first
    store.append(newer, "order-1", [created()], expected_version=NO_STREAM)
    newer.commit()
    with pytest.raises(ConcurrencyConflict, match="newer than this one"):
        store.append(older, "order-1", [OrderConfirmed("1")], expected_version=1)
    older.rollback()
    store.append(older, "order-1", [OrderConfirmed("1")], expected_version=1)  # a new transaction: a newer id
    older.commit()
    rows = older.execute(
        sql.SQL("SELECT version FROM {}.events ORDER BY tx_id, position").format(sql.Identifier(store.schema))
    ).fetchall()
    assert [r[0] for r in rows] == [1, 2]
    older.close()
    newer.close()


def test_a_duplicate_version_is_an_error_never_a_silent_skip(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    """Had the insert said ON CONFLICT DO NOTHING, the second event would vanish while the append reported success."""
    store = EventStore(event_schema.schema, registry)
    store.append(conn, "order-1", [created()])
    # An event slipped in behind the streams row's back (a buggy tool): the stream row says 1.
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.events (stream_id, version, event_id, type, schema_version, data)"
            " VALUES ('order-1', 2, gen_random_uuid(), 'OrderConfirmed', 1, '{{\"order_id\": \"1\"}}')"
        ).format(sql.Identifier(store.schema))
    )
    with pytest.raises(ConcurrencyConflict, match="duplicate key"), conn.transaction():
        store.append(conn, "order-1", [PaymentReceived("1", 5)], expected_version=1)
    assert [e.type for e in store.read(conn, "order-1")] == ["OrderCreated", "OrderConfirmed"]


def test_upcasting_reads_order_created_v1_as_v2_with_the_default_currency(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    raw_insert(
        conn,
        store.schema,
        "order-old",
        1,
        "OrderCreated",
        1,
        {"order_id": "old", "customer_id": "c", "amount_cents": 500},
    )
    store.append(conn, "order-new", [created("new")])
    old, new = store.read(conn, "order-old")[0], store.read(conn, "order-new")[0]
    assert old.event == OrderCreated("old", "c", 500, DEFAULT_CURRENCY)
    assert old.schema_version == 1, "the record says what was stored; the event is the current version"
    assert new.event.currency == "USD" and new.schema_version == 2


def test_upcaster_chains_are_checked_at_start_up() -> None:
    @attrs.frozen
    class Shipped:
        order_id: str

    gaps = EventRegistry()
    gaps.register(Shipped, "Shipped", version=3)
    gaps.add_upcaster("Shipped", 1, lambda d: d)
    with pytest.raises(EventRegistryError, match="Shipped: no upcaster from version 2 to 3"):
        EventStore("anywhere", gaps)
    stray = EventRegistry()
    stray.register(Shipped, "Shipped", version=2, since=2)
    stray.add_upcaster("Shipped", 1, lambda d: d)
    stray.add_upcaster("Gone", 1, lambda d: d)
    with pytest.raises(EventRegistryError) as caught:
        stray.check()
    assert "Shipped: an upcaster from version 1, outside 2..1" in str(caught.value)
    assert "an upcaster of 'Gone' from version 1, but no such event type" in str(caught.value)
    with pytest.raises(EventRegistryError, match="registered twice"):
        stray.register(Shipped, "Other")


@pytest.mark.parametrize(
    ("type_", "version", "data", "error", "reason"),
    [
        ("OrderShipped", 1, {"order_id": "1"}, UnknownEventType, "unknown event type 'OrderShipped'"),
        ("OrderCreated", 3, {"order_id": "1"}, UnknownSchemaVersion, "schema version 3 is unknown here"),
        ("OrderCreated", 2, {"order_id": "1"}, InvalidEventData, "not a valid OrderCreated v2"),
        ("PaymentReceived", 1, {"order_id": "1", "amount_cents": "lots"}, InvalidEventData, "amount_cents"),
    ],
)
def test_an_event_that_cannot_be_read_names_its_position_and_reason(
    event_schema: EventSchema,
    conn: psycopg.Connection[Any],
    type_: str,
    version: int,
    data: dict[str, Any],
    error: type[Exception],
    reason: str,
) -> None:
    store = EventStore(event_schema.schema, registry)
    position = raw_insert(conn, store.schema, "order-1", 1, type_, version, data)
    with pytest.raises(error) as caught:
        store.read(conn, "order-1")
    message = str(caught.value)
    assert f"event at position {position} (stream order-1 version 1)" in message
    assert reason in message


def test_the_gap_safe_read_walks_its_index_in_order_without_sorting(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    """A catch-up that sorted everything after its checkpoint would cost more per batch as the log grows."""
    store = EventStore(event_schema.schema, registry)
    for n in range(50):
        store.append(conn, f"order-{n}", [created(str(n))])
    conn.execute("SET enable_seqscan = off")  # a table this small would rather be scanned and sorted
    params = {"after_tx_id": 0, "after_position": 10, "limit": 5, "all_types": True, "types": []}
    explain = b"EXPLAIN " + query("read_safe", store.schema, "events.sql")
    plan = "\n".join(row[0] for row in conn.execute(explain, params))
    assert "Index Scan using events_tx_position" in plan and "Sort" not in plan, plan
