"""The saga store: saga tables, their rows and log entries, and the reads the saga engine acts on.

Every function runs on the caller's connection, inside the caller's transaction (the
orchestrator's step, the watchdog's or an operator's). The writes (a new saga, its
transitions, its log) are in :mod:`estafeta_sql.saga_writes`, so that a transition commits or
rolls back with the commands it sends; what operators list and count is in
:mod:`estafeta_sql.saga_reports`.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import migrate, plan, queries
from .migrate import Migration

#: Statuses of a saga that is still waiting for a reply.
LIVE = ("running", "compensating")
#: The status of a saga the watchdog stopped waiting for: its command (a step past the point
#: of no return, or a compensation) got no reply after all its attempts. Not final: the
#: participant may still act and answer, and that late answer moves the saga on; until then
#: an operator checks the participant, then resumes or aborts it (never compensates by hand).
GAVE_UP = "gave_up"
#: Statuses a saga ends in: nothing moves it out of them but an operator.
ENDED = ("completed", "compensated", "failed")
#: Every status a saga can be in.
STATUSES = (*LIVE, GAVE_UP, *ENDED)


@attrs.frozen
class SagaTable:
    """Where one kind of saga keeps its rows: ``<schema>.saga_<name>`` and ``<schema>.saga_<name>_log``."""

    #: The owning service's schema (its outbox carries the saga's commands).
    schema: str
    #: The saga table.
    table: str
    #: The transition log.
    log: str
    #: The column holding the saga's key (``order_id``): the ordering key of its messages.
    key: str


@attrs.frozen
class SagaRow:
    """A saga's persisted state."""

    saga_id: uuid.UUID
    #: The value of the table's key column.
    key: Any
    status: str
    current_step: str
    #: The saga's data, as JSON.
    payload: dict[str, Any]
    #: What each completed action answered, by step name.
    results: dict[str, Any]
    #: The compensation plan (step names in the order they run), once compensating.
    compensations: list[str] | None
    #: Sends of the current command so far.
    attempts: int
    step_timeout: timedelta
    deadline_at: datetime | None
    started_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    last_error: str | None
    version: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SagaRow:
        """Build from a ``dict_row`` of the saga queries."""
        return cls(**row)

    @property
    def live(self) -> bool:
        """Whether the saga still waits for a reply."""
        return self.status in LIVE


@attrs.frozen
class LogEntry:
    """One transition of a saga."""

    version: int
    status: str
    step: str
    event: str
    detail: str | None
    at: datetime


#: SQL types of saga keys, by the Python type of the data class's key field.
KEY_TYPES = {uuid.UUID: "uuid", int: "bigint", str: "text"}


def table_migrations(table: SagaTable, key_type: str) -> list[Migration]:
    """The migrations of ``table``'s saga table and log, from ``sql/migrations/_saga/``, in order.

    Each is recorded in ``schema_migrations`` as ``<table>/<file>`` (``saga_order/0001_tables.sql``).
    """
    if key_type not in KEY_TYPES.values():
        raise ValueError(f"saga key type {key_type!r} is not one of {', '.join(KEY_TYPES.values())}")
    names = {
        "table": sql.Identifier(table.table),
        "log": sql.Identifier(table.log),
        "key": sql.Identifier(table.key),
        "key_type": sql.SQL(key_type),
        "live_index": sql.Identifier(f"{table.table}_live"),
        "key_index": sql.Identifier(f"{table.table}_{table.key}"),
        "started_index": sql.Identifier(f"{table.table}_started_at"),
        "log_index": sql.Identifier(f"{table.log}_saga"),
        "newest_index": sql.Identifier(f"{table.table}_newest"),
        "status_index": sql.Identifier(f"{table.table}_status_newest"),
        "step_index": sql.Identifier(f"{table.table}_step_newest"),
        "stats": sql.Identifier(f"{table.table}_status_step"),
        "ended_index": sql.Identifier(f"{table.table}_ended"),
    }
    return [
        Migration(f"{table.table}/{m.name.partition('/')[2]}", sql.SQL(m.text).format(**names).as_string())
        for m in migrate.load([migrate.builtin_directory("_saga")])
    ]


def names() -> list[str]:
    """Every query name defined in ``sagas.sql``."""
    return sorted(queries.parse("sagas.sql"))


@functools.cache
def query(name: str, table: SagaTable) -> bytes:
    """The query ``name`` with the schema, table, log and key column of ``table`` bound as identifiers."""
    body = queries.body("sagas.sql", name)
    return queries.rendered(
        sql.SQL(body).format(
            schema=sql.Identifier(table.schema),
            table=sql.Identifier(table.table),
            log=sql.Identifier(table.log),
            key=sql.Identifier(table.key),
        )
    )


def fetch_row(conn: psycopg.Connection[Any], name: str, table: SagaTable, params: dict[str, Any]) -> SagaRow | None:
    """The one saga row the query ``name`` of ``table`` returns with ``params``, or ``None``."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name, table), params)
        row = cur.fetchone()
    return SagaRow.from_row(row) if row else None


def get(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> SagaRow | None:
    """The saga's row, unlocked (for reading)."""
    return fetch_row(conn, "get_saga", table, {"saga_id": saga_id})


def lock(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> SagaRow | None:
    """The saga's row, locked until the caller's transaction ends."""
    return fetch_row(conn, "lock_saga", table, {"saga_id": saga_id})


def lock_statement(table: SagaTable, saga_id: uuid.UUID) -> plan.Statement:
    """:func:`lock`'s statement (its dict row is a :meth:`SagaRow.from_row`)."""
    return plan.Statement(query("lock_saga", table), {"saga_id": saga_id}, plan.Fetch.DICTS)


def lock_plan(table: SagaTable, saga_id: uuid.UUID) -> plan.Plan[SagaRow | None]:
    """:func:`lock`, as a plan."""
    result = yield lock_statement(table, saga_id)
    row = result.first()
    return SagaRow.from_row(row) if row else None


def lock_overdue(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> SagaRow | None:
    """The saga's row, locked, if it is live, past its deadline, and nobody else holds it."""
    return fetch_row(conn, "lock_overdue", table, {"saga_id": saga_id})


def overdue(conn: psycopg.Connection[Any], table: SagaTable, limit: int) -> list[uuid.UUID]:
    """Live sagas past their deadline, the most overdue first."""
    return [row[0] for row in conn.execute(query("list_overdue", table), {"limit": limit}).fetchall()]


def live(conn: psycopg.Connection[Any], table: SagaTable, limit: int) -> list[uuid.UUID]:
    """Live sagas, the nearest deadline first."""
    return [row[0] for row in conn.execute(query("list_live", table), {"limit": limit}).fetchall()]


def sends(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID, step: str) -> int:
    """How many times the saga sent ``step``'s action (entering it, re-sends, resumes), by its log."""
    found = conn.execute(query("count_sends", table), {"saga_id": saga_id, "step": step}).fetchone()
    return int(found[0]) if found else 0


def timeline(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> list[LogEntry]:
    """Every logged transition of the saga, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("saga_log", table), {"saga_id": saga_id})
        return [LogEntry(**row) for row in cur.fetchall()]


def of_key(conn: psycopg.Connection[Any], table: SagaTable, key: Any) -> list[uuid.UUID]:
    """The sagas started for ``key`` (an order id), oldest first."""
    return [row[0] for row in conn.execute(query("sagas_of_key", table), {"key": key}).fetchall()]


def dead_letter_reason(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> str | None:
    """Why ``consumer`` parked ``message_id``, if it did."""
    table = SagaTable(schema, "dead_letters", "dead_letters", "id")
    params = {"consumer": consumer, "message_id": str(message_id)}
    found = conn.execute(query("find_dead_letter", table), params).fetchone()
    return str(found[0]) if found else None
