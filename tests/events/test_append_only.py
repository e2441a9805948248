"""The event store is append-only: UPDATE and DELETE on ``events`` are refused, except on purpose.

The way out is a transaction-local setting (``EventStore.allow_rewrite``), which pruning and
crypto-shredding code sets where it rewrites; it ends with the transaction.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from estafeta.events.store import EventStore

from .event_types import OrderCreated, PaymentReceived, registry
from .support import EventSchema


def _events(schema: str) -> sql.Composed:
    return sql.SQL("{}.events").format(sql.Identifier(schema))


def _store_with_two_events(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> EventStore:
    store = EventStore(event_schema.schema, registry)
    store.append(conn, "order-1", [OrderCreated("1", "c1", 700, "USD"), PaymentReceived("1", 700)])
    return store


def test_update_and_delete_of_events_are_refused_with_a_clear_error(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    _store_with_two_events(event_schema, conn)
    table = _events(event_schema.schema)
    attempts = [
        sql.SQL("UPDATE {} SET data = '{{}}' WHERE version = 1").format(table),
        sql.SQL("DELETE FROM {} WHERE version = 2").format(table),
        sql.SQL("DELETE FROM {}").format(table),
    ]
    for statement in attempts:
        with pytest.raises(psycopg.errors.RestrictViolation) as caught:
            conn.execute(statement)
        verb = statement.as_string(conn).split()[0]
        assert caught.value.diag.message_primary == (
            f"{verb} on {event_schema.schema}.events refused: the event store is append-only"
        )
        assert "SET LOCAL estafeta.events_rewrite = 'on'" in (caught.value.diag.message_hint or "")
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (2,)


def test_a_transaction_that_allows_rewriting_can_shred_and_prune_and_the_permission_ends_with_it(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = _store_with_two_events(event_schema, conn)
    table = _events(event_schema.schema)
    with conn.transaction():
        store.allow_rewrite(conn)
        # Crypto-shredding: the personal data is replaced; pruning: an event goes.
        conn.execute(sql.SQL("UPDATE {} SET data = %s WHERE version = 1").format(table), (Jsonb({"shredded": True}),))
        conn.execute(sql.SQL("DELETE FROM {} WHERE version = 2").format(table))
    rows = conn.execute(sql.SQL("SELECT version, data FROM {} ORDER BY version").format(table)).fetchall()
    assert rows == [(1, {"shredded": True})]
    # The next transaction on the same connection (a pooled one, say) is refused again.
    with pytest.raises(psycopg.errors.RestrictViolation), conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {}").format(table))
    with pytest.raises(ValueError, match="needs a transaction"):
        store.allow_rewrite(conn)  # autocommit, no transaction: it would end at once


def test_appends_reads_and_truncate_still_work(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    store = _store_with_two_events(event_schema, conn)
    store.append(conn, "order-1", [PaymentReceived("1", 5)], expected_version=2)
    assert [e.version for e in store.read(conn, "order-1")] == [1, 2, 3]
    # TRUNCATE fires no row trigger: the test suites' wipes keep working.
    conn.execute(sql.SQL("TRUNCATE {}").format(_events(event_schema.schema)))
    assert store.read(conn, "order-1") == []
