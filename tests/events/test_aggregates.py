"""Aggregates: load and save with the expected version, snapshots keyed by schema version, temporal queries."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from estafeta.events.aggregates import NoApplyFor, Repository, StreamNotFound
from estafeta.events.store import ConcurrencyConflict, EventStore

from .event_types import Order, OrderConfirmed, OrderCreated, registry
from .support import EventSchema


def repository(schema: EventSchema, cls: type[Order] = Order) -> Repository[Any]:
    return Repository(EventStore(schema.schema, registry), cls)


def snapshots(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT aggregate, schema_version, version FROM {}.snapshots ORDER BY version")
    return conn.execute(query.format(sql.Identifier(schema))).fetchall()


def test_create_save_load_and_concurrent_saves(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    orders = repository(event_schema)
    order = Order.create("1", "c1", 700, "EUR")
    assert orders.save(conn, order)[0].version == 1 and order.pending_events == []
    first, second = orders.load(conn, "order-1"), orders.load(conn, "order-1")
    first.pay(700)
    second.pay(700)
    orders.save(conn, first)
    with pytest.raises(ConcurrencyConflict, match="is at version 2, expected 1"):
        orders.save(conn, second)
    again = orders.load(conn, "order-1")
    again.confirm()
    orders.save(conn, again)
    loaded = orders.load(conn, "order-1")
    assert (loaded.status, loaded.paid_cents, loaded.version) == ("confirmed", 700, 3)
    with pytest.raises(StreamNotFound, match="stream 'order-2'"):
        orders.load(conn, "order-2")
    with pytest.raises(ConcurrencyConflict, match="already exists"):
        orders.save(conn, Order.create("1", "c1", 1, "EUR"))


def test_an_event_without_an_apply_method_is_refused(event_schema: EventSchema) -> None:
    @attrs.define
    class Strict(Order):
        pass

    order = Strict.new("order-x")
    with pytest.raises(NoApplyFor, match="Strict has no @applies method for str"):
        order.record("not an event")


def test_snapshots_every_n_events_are_used_on_load(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    orders = repository(event_schema)
    order = Order.create("1", "c1", 700, "EUR")
    for _ in range(24):
        order.add_item("sku", 1)
        if order.version % 5 == 0:
            orders.save(conn, order)
    orders.save(conn, order)
    assert snapshots(conn, event_schema.schema) == [("Order", 1, 10), ("Order", 1, 20)]
    # Tamper with the newest snapshot: a load that reflects it proves the snapshot was used.
    conn.execute(
        sql.SQL("UPDATE {}.snapshots SET state = state || '{{\"items\": 1000}}' WHERE version = 20").format(
            sql.Identifier(event_schema.schema)
        )
    )
    assert orders.load(conn, "order-1").items == 1000 + 5
    assert orders.load(conn, "order-1", version=15).items == 14, "the snapshot at 10 plus five events"


def test_snapshots_of_another_schema_version_are_ignored(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    orders = repository(event_schema)
    order = Order.create("1", "c1", 700, "EUR")
    for _ in range(11):
        order.add_item("sku", 2)
    orders.save(conn, order)
    conn.execute(
        sql.SQL("UPDATE {}.snapshots SET state = state || '{{\"items\": -1}}'").format(
            sql.Identifier(event_schema.schema)
        )
    )
    assert orders.load(conn, "order-1").items == -1, "the (tampered) snapshot at version 12 is used"

    @attrs.define
    class OrderV2(Order):
        """The same aggregate after a schema change: counts lines, not quantities."""

        schema_version = 2
        lines: int = 0

    renamed = Repository(EventStore(event_schema.schema, registry), OrderV2)
    renamed.name = "Order"  # same snapshot key as before, new schema version
    reloaded = renamed.load(conn, "order-1")
    assert reloaded.items == 22, "replayed from the events, not misread from the old snapshot"
    for _ in range(10):
        reloaded.add_item("sku", 1)
    renamed.save(conn, reloaded)
    assert ("Order", 2, 22) in snapshots(conn, event_schema.schema)


def test_a_field_change_without_a_schema_bump_is_caught_by_the_fingerprint(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    orders = repository(event_schema)
    order = Order.create("1", "c1", 700, "EUR")
    for _ in range(10):
        order.add_item("sku", 3)
    orders.save(conn, order)
    conn.execute(
        sql.SQL("UPDATE {}.snapshots SET state = state || '{{\"items\": -1}}'").format(
            sql.Identifier(event_schema.schema)
        )
    )

    @attrs.define
    class Forgetful(Order):
        note: str = ""  # a new field, schema_version left at 1

    same_key = Repository(EventStore(event_schema.schema, registry), Forgetful)
    same_key.name = "Order"
    assert same_key.load(conn, "order-1").items == 30


def test_temporal_queries(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    orders = repository(event_schema)
    store = orders.store
    order = Order.create("1", "c1", 700, "EUR")
    orders.save(conn, order)
    [other] = store.append(conn, "order-2", [OrderCreated("2", "c2", 50, "EUR")])
    time.sleep(0.01)
    between = datetime.now(UTC)
    time.sleep(0.01)
    order.pay(700)
    order.confirm()
    orders.save(conn, order)
    assert orders.load(conn, "order-1", version=1).status == "created"
    assert orders.load(conn, "order-1", as_of=between).status == "created"
    assert orders.load(conn, "order-1").status == "confirmed"
    assert orders.load(conn, "order-1", position=other.position).version == 1
    with pytest.raises(StreamNotFound, match="as of time"):
        orders.load(conn, "order-1", as_of=datetime(2000, 1, 1, tzinfo=UTC))
    # The whole store as of a global position, and one stream as of a time.
    assert [(e.stream_id, e.version) for e in store.read_all(conn, up_to=other.position)] == [
        ("order-1", 1),
        ("order-2", 1),
    ]
    assert [e.version for e in store.read(conn, "order-1", as_of=between)] == [1]
    later = store.read(conn, "order-1", after_version=1)
    assert [type(e.event).__name__ for e in later] == ["PaymentReceived", "OrderConfirmed"]
    assert isinstance(later[-1].event, OrderConfirmed)
