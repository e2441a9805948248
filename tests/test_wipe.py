"""The runtime fixture's wipe: every test starts on empty tables whose ids start at 1 again.

The wipe truncates only the tables a test wrote to (see ``conftest._WIPE``): these tests pin
down that a written table, a table whose rows were deleted (its sequence still advanced) and a
table without a sequence all come back as a TRUNCATE of every table would leave them.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from .conftest import _wipe
from .helpers import scalar

_ROW = sql.SQL(
    "INSERT INTO {}.outbox (message_id, queue_name, actor_name, message)"
    " VALUES (gen_random_uuid(), 'q', 'a', '{{}}') RETURNING id"
)


def _insert(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(_ROW.format(sql.Identifier(schema))).fetchone()
    assert row is not None
    return int(row[0])


def test_the_wipe_empties_what_a_test_wrote_and_restarts_its_ids(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    assert [_insert(conn, "orders"), _insert(conn, "orders")] == [1, 2]  # the fixture's wipe ran first
    _insert(conn, "payments")
    conn.execute("DELETE FROM payments.outbox")  # empty, but its sequence moved on
    conn.execute("INSERT INTO orders.inbox (consumer, message_id) VALUES ('c', gen_random_uuid())")  # no sequence

    _wipe(database_url)

    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 0
    assert scalar(conn, "SELECT count(*) FROM orders.inbox") == 0
    assert _insert(conn, "orders") == 1
    assert _insert(conn, "payments") == 1


def test_the_wipe_keeps_the_migrations_record(database_url: str, conn: psycopg.Connection[Any]) -> None:
    applied = scalar(conn, "SELECT count(*) FROM orders.schema_migrations")
    _insert(conn, "orders")
    _wipe(database_url)
    assert applied > 0
    assert scalar(conn, "SELECT count(*) FROM orders.schema_migrations") == applied
