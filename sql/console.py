"""Queries of the operator console that no other store needs."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import queries


@attrs.frozen
class DeadLetterCause:
    """Dead letters of one consumer that failed the same way (ids and numbers aside)."""

    consumer: str
    #: The reason with UUIDs masked as ``<id>`` and numbers as ``<n>``.
    cause: str
    count: int
    latest_at: datetime
    latest_id: int
    #: The newest one's reason, as written.
    latest_reason: str


def names() -> list[str]:
    """Every query name defined in ``console.sql``."""
    return sorted(queries.parse("console.sql"))


@functools.cache
def query(name: str, schema: str) -> sql.Composed:
    """The query ``name`` with ``{schema}`` bound to ``schema`` as an identifier."""
    return sql.SQL(queries.body("console.sql", name)).format(schema=sql.Identifier(schema))


def dead_letters_by_cause(conn: psycopg.Connection[Any], schema: str, limit: int = 50) -> list[DeadLetterCause]:
    """``schema``'s dead letters grouped by consumer and cause, the most frequent first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("dead_letters_by_cause", schema), {"limit": limit})
        return [DeadLetterCause(**row) for row in cur.fetchall()]
