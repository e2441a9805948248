"""Looking sagas up as an operator does: by id, by business key, by a prefix of either; where they stand.

Each lookup walks an index (the primary key or the key column's): a prefix becomes a range
between the prefix padded with ``0`` and with ``f``, so finding a saga by the first
characters of its id costs what finding it by the whole id does. Read only, on the
caller's connection.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import queries
from .sagas import SagaRow, SagaTable

_FILE = "saga_lookup.sql"
#: The hex digits of a uuid.
_HEX = frozenset("0123456789abcdef")


@functools.cache
def _query(name: str, table: SagaTable) -> bytes:
    return queries.rendered(
        sql.SQL(queries.body(_FILE, name)).format(
            schema=sql.Identifier(table.schema), table=sql.Identifier(table.table), key=sql.Identifier(table.key)
        )
    )


def uuid_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The lowest and highest uuid starting with ``text`` (hex digits, dashes ignored); ``None``: none can."""
    digits = text.strip().lower().replace("-", "")
    if not digits or len(digits) > 32 or not set(digits) <= _HEX:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _rows(conn: psycopg.Connection[Any], name: str, table: SagaTable, params: dict[str, Any]) -> list[SagaRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(_query(name, table), params)
        return [SagaRow.from_row(row) for row in cur.fetchall()]


def by_id_range(
    conn: psycopg.Connection[Any], table: SagaTable, low: uuid.UUID, high: uuid.UUID, limit: int
) -> list[SagaRow]:
    """Up to ``limit`` sagas whose id lies between ``low`` and ``high``, in id order."""
    return _rows(conn, "sagas_in_id_range", table, {"low": low, "high": high, "limit": limit})


def by_key(conn: psycopg.Connection[Any], table: SagaTable, key: Any, limit: int) -> list[SagaRow]:
    """Up to ``limit`` sagas of the business key ``key``, newest first."""
    return _rows(conn, "sagas_of_key_value", table, {"key": key, "limit": limit})


def by_key_range(
    conn: psycopg.Connection[Any], table: SagaTable, low: uuid.UUID, high: uuid.UUID, limit: int
) -> list[SagaRow]:
    """Up to ``limit`` sagas whose uuid key lies between ``low`` and ``high``, in key order."""
    return _rows(conn, "sagas_in_key_range", table, {"low": low, "high": high, "limit": limit})


@attrs.frozen
class Standing:
    """How many sagas stand on one step now."""

    status: str
    step: str
    #: Whether they stand on the step's undo (or a step after compensation), not on its action.
    compensating: bool
    count: int


def standing_by_step(conn: psycopg.Connection[Any], table: SagaTable) -> list[Standing]:
    """Live and failed sagas by status and the step they stand on."""
    rows = conn.execute(_query("standing_by_step", table)).fetchall()
    return [Standing(str(status), str(step), bool(comp), int(n)) for status, step, comp, n in rows]
