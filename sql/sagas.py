"""The saga store: saga rows, their transitions and their log, in the owning service's schema.

Every function runs on the caller's connection, inside the caller's transaction (the
orchestrator's step, the watchdog's or an operator's), so a transition commits or rolls
back with the commands it sends.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import migrate, plan, queries, retention
from .migrate import Migration

#: Statuses of a saga that is still waiting for a reply.
LIVE = ("running", "compensating")
#: Statuses a saga ends in.
ENDED = ("completed", "compensated", "failed")


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


def _one(conn: psycopg.Connection[Any], name: str, table: SagaTable, params: dict[str, Any]) -> SagaRow | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name, table), params)
        row = cur.fetchone()
    return SagaRow.from_row(row) if row else None


def insert(
    conn: psycopg.Connection[Any],
    table: SagaTable,
    *,
    saga_id: uuid.UUID,
    key: Any,
    step: str,
    payload: dict[str, Any],
    step_timeout: timedelta,
    wait: timedelta,
) -> bool:
    """Create a running saga waiting on ``step``; ``False`` if ``saga_id`` already exists."""
    statement = insert_statement(
        table, saga_id=saga_id, key=key, step=step, payload=payload, step_timeout=step_timeout, wait=wait
    )
    result = plan.execute(conn, statement)
    return result is not None and result.rowcount == 1


def insert_statement(
    table: SagaTable,
    *,
    saga_id: uuid.UUID,
    key: Any,
    step: str,
    payload: dict[str, Any],
    step_timeout: timedelta,
    wait: timedelta,
) -> plan.Statement:
    """The statement of :func:`insert`, for a plan (its result's ``rowcount`` is 1 if the saga is new)."""
    params = {
        "saga_id": saga_id,
        "key": key,
        "step": step,
        "payload": Jsonb(payload),
        "step_timeout": step_timeout,
        "wait": wait,
    }
    return plan.Statement(query("insert_saga", table), params, plan.Fetch.ROWCOUNT)


def get(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> SagaRow | None:
    """The saga's row, unlocked (for reading)."""
    return _one(conn, "get_saga", table, {"saga_id": saga_id})


def lock(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> SagaRow | None:
    """The saga's row, locked until the caller's transaction ends."""
    return _one(conn, "lock_saga", table, {"saga_id": saga_id})


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
    return _one(conn, "lock_overdue", table, {"saga_id": saga_id})


def overdue(conn: psycopg.Connection[Any], table: SagaTable, limit: int) -> list[uuid.UUID]:
    """Live sagas past their deadline, the most overdue first."""
    return [row[0] for row in conn.execute(query("list_overdue", table), {"limit": limit}).fetchall()]


def live(conn: psycopg.Connection[Any], table: SagaTable, limit: int) -> list[uuid.UUID]:
    """Live sagas, the nearest deadline first."""
    return [row[0] for row in conn.execute(query("list_live", table), {"limit": limit}).fetchall()]


def transition(
    conn: psycopg.Connection[Any],
    table: SagaTable,
    row: SagaRow,
    *,
    status: str,
    step: str,
    wait: timedelta,
    results: dict[str, Any] | None = None,
    compensations: Sequence[str] | None = None,
    last_error: str | None = None,
    event: str,
    detail: str | None = None,
) -> SagaRow:
    """Move ``row`` (read under its lock) to ``status`` waiting on ``step``, and log it; return the new row.

    The version goes up by one, the attempt count restarts at 1 and the deadline at
    ``now() + wait`` (none once the saga has ended). ``results`` and ``compensations``
    default to the row's. The log row (``event``, ``detail``) is written by the same
    statement.
    """
    params = {
        "event": event,
        "detail": detail,
        "saga_id": row.saga_id,
        "version": row.version,
        "status": status,
        "step": step,
        "results": Jsonb(row.results if results is None else results),
        "compensations": row.compensations if compensations is None else list(compensations),
        "last_error": last_error,
        "wait": wait,
    }
    return _changed(conn, "transition", table, row, params)


def record_resend(conn: psycopg.Connection[Any], table: SagaTable, row: SagaRow, *, wait: timedelta) -> SagaRow:
    """Count one more send of the current command and push the deadline to ``now() + wait``; return the new row."""
    params = {"saga_id": row.saga_id, "version": row.version, "wait": wait}
    return _changed(conn, "record_resend", table, row, params)


def record_error(conn: psycopg.Connection[Any], table: SagaTable, row: SagaRow, error: str) -> int:
    """Record ``error`` as the row's ``last_error`` (and in its log), look again one step timeout later.

    Return how many errors in a row the saga has met now: those logged since its last
    logged transition or re-send, this one included.
    """
    params = {"saga_id": row.saga_id, "version": row.version, "error": error}
    found = conn.execute(query("record_error", table), params).fetchone()
    if found is None:
        raise RuntimeError(f"saga {row.saga_id} changed under its lock (version {row.version})")
    return int(found[0])


def clear_error(conn: psycopg.Connection[Any], table: SagaTable, row: SagaRow) -> None:
    """Clear ``row``'s ``last_error`` (read under its lock); its log keeps every error."""
    params = {"saga_id": row.saga_id, "version": row.version}
    if conn.execute(query("clear_error", table), params).fetchone() is None:
        raise RuntimeError(f"saga {row.saga_id} changed under its lock (version {row.version})")


def _changed(
    conn: psycopg.Connection[Any], name: str, table: SagaTable, row: SagaRow, params: dict[str, Any]
) -> SagaRow:
    changed = _one(conn, name, table, params)
    if changed is None:
        raise RuntimeError(f"saga {row.saga_id} changed under its lock (version {row.version})")
    return changed


def log(
    conn: psycopg.Connection[Any],
    table: SagaTable,
    *,
    saga_id: uuid.UUID,
    version: int,
    status: str,
    step: str,
    event: str,
    detail: str | None = None,
) -> None:
    """Append a transition to the saga's log."""
    plan.execute(
        conn,
        log_statement(table, saga_id=saga_id, version=version, status=status, step=step, event=event, detail=detail),
    )


def log_statement(
    table: SagaTable,
    *,
    saga_id: uuid.UUID,
    version: int,
    status: str,
    step: str,
    event: str,
    detail: str | None = None,
) -> plan.Statement:
    """The statement of :func:`log`, for a plan."""
    params = {
        "saga_id": saga_id,
        "version": version,
        "status": status,
        "step": step,
        "event": event,
        "detail": detail,
    }
    return plan.Statement(query("insert_log", table), params)


def sends(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID, step: str) -> int:
    """How many times the saga sent ``step``'s action (entering it, re-sends, resumes), by its log."""
    found = conn.execute(query("count_sends", table), {"saga_id": saga_id, "step": step}).fetchone()
    return int(found[0]) if found else 0


def timeline(conn: psycopg.Connection[Any], table: SagaTable, saga_id: uuid.UUID) -> list[LogEntry]:
    """Every logged transition of the saga, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("saga_log", table), {"saga_id": saga_id})
        return [LogEntry(**row) for row in cur.fetchall()]


def search(
    conn: psycopg.Connection[Any], table: SagaTable, *, status: str | None, stuck: bool, limit: int
) -> list[SagaRow]:
    """Sagas, newest first: all, or those in ``status``, or (``stuck``) live ones past their deadline."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_sagas", table), {"status": status, "stuck": stuck, "limit": limit})
        return [SagaRow.from_row(row) for row in cur.fetchall()]


def of_key(conn: psycopg.Connection[Any], table: SagaTable, key: Any) -> list[uuid.UUID]:
    """The sagas started for ``key`` (an order id), oldest first."""
    return [row[0] for row in conn.execute(query("sagas_of_key", table), {"key": key}).fetchall()]


def count_by_status(conn: psycopg.Connection[Any], table: SagaTable) -> dict[str, int]:
    """How many sagas are in each status."""
    return {str(s): int(n) for s, n in conn.execute(query("count_by_status", table)).fetchall()}


def stalls(conn: psycopg.Connection[Any], table: SagaTable, stuck_after: timedelta) -> tuple[int, float]:
    """Live sagas in one state for longer than ``stuck_after``, and the longest such wait in seconds.

    A saga's state is its version: a transition moves it, a re-send of the same command does not.
    """
    row = conn.execute(query("stalls", table), {"stuck_after": stuck_after}).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


@attrs.frozen
class Latency:
    """Start-to-end seconds of ended sagas."""

    ended: int
    p50: float | None
    p99: float | None
    #: Seconds from the first start to the last end.
    span: float | None


def latency(conn: psycopg.Connection[Any], table: SagaTable, saga_ids: Sequence[uuid.UUID]) -> Latency:
    """Latency percentiles of the ended sagas among ``saga_ids``."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("latency", table), {"ids": list(saga_ids)})
        row = cur.fetchone()
    assert row is not None
    return Latency(
        ended=int(row["ended"]),
        **{k: (float(row[k]) if row[k] is not None else None) for k in ("p50", "p99", "span")},
    )


def requeue_command(conn: psycopg.Connection[Any], schema: str, message_id: uuid.UUID) -> bool:
    """Put the outbox row of ``message_id`` back in line if it is still there; ``False`` if it is not."""
    table = SagaTable(schema, "outbox", "outbox", "id")
    return conn.execute(query("requeue_command", table), {"message_id": message_id}).fetchone() is not None


def dead_letter_reason(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> str | None:
    """Why ``consumer`` parked ``message_id``, if it did."""
    table = SagaTable(schema, "dead_letters", "dead_letters", "id")
    params = {"consumer": consumer, "message_id": str(message_id)}
    found = conn.execute(query("find_dead_letter", table), params).fetchone()
    return str(found[0]) if found else None


def count_ended(conn: psycopg.Connection[Any], table: SagaTable, saga_ids: Sequence[uuid.UUID]) -> int:
    """How many of ``saga_ids`` have ended."""
    found = conn.execute(query("count_ended", table), {"ids": list(saga_ids)}).fetchone()
    return int(found[0]) if found else 0


def outcomes(
    conn: psycopg.Connection[Any], table: SagaTable, saga_ids: Sequence[uuid.UUID]
) -> list[tuple[str, str | None]]:
    """(status, last_error) of each of ``saga_ids``."""
    return [(str(s), e) for s, e in conn.execute(query("outcomes", table), {"ids": list(saga_ids)}).fetchall()]


def prune_log(
    conn: psycopg.Connection[Any],
    table: SagaTable,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
) -> int:
    """Delete the log of sagas completed or compensated more than ``older_than`` ago; return how many rows.

    Failed and live sagas keep their log; saga rows are never deleted. With ``dry_run``,
    count instead.
    """
    params = {"older_than": older_than, "batch": batch_size}
    if dry_run:
        return retention.count(conn, query("count_prunable_log", table), params)
    return retention.delete_in_batches(conn, query("prune_log", table), params)


@attrs.frozen
class ListFilter:
    """Which sagas a list shows; ``None`` leaves a field out."""

    status: str | None = None
    #: The step the saga waits on (or stopped at).
    step: str | None = None
    #: Started at or after.
    since: datetime | None = None
    #: Started before.
    until: datetime | None = None
    #: Text found in ``last_error`` (case-insensitive, taken literally: no wildcards).
    error: str | None = None
    #: The keyset cursor: only sagas that come after ``(started_at, saga_id)`` newest first.
    after: tuple[datetime, uuid.UUID] | None = None


#: The columns of a saga row, as ``SagaRow`` names them.
_ROW = sql.SQL(
    "saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,"
    " step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version"
)
#: Each filter's condition; only the given ones are written into the statement, so that the
#: planner sees plain equalities and picks the index that serves them (never an
#: ``(%s IS NULL OR ...)`` it must plan for either case).
_CONDITIONS = {
    "status": "status = %(status)s",
    "step": "current_step = %(step)s",
    "since": "started_at >= %(since)s",
    "until": "started_at < %(until)s",
    "error": "strpos(lower(last_error), lower(%(error)s)) > 0",
    "after": "(started_at, saga_id) < (%(after_at)s, %(after_id)s)",
}


def list_query(table: SagaTable, where: ListFilter) -> sql.Composed:
    """The statement of one page of ``where``'s sagas, newest first (its parameters: ``list_params``)."""
    given = [name for name in _CONDITIONS if getattr(where, name) is not None]
    conditions = sql.SQL(" AND ").join(sql.SQL(_CONDITIONS[name]) for name in given) if given else sql.SQL("true")
    return sql.SQL(
        "SELECT {row} FROM {schema}.{table} WHERE {conditions} ORDER BY started_at DESC, saga_id DESC LIMIT %(limit)s"
    ).format(
        row=_ROW.format(key=sql.Identifier(table.key)),
        schema=sql.Identifier(table.schema),
        table=sql.Identifier(table.table),
        conditions=conditions,
    )


def list_params(where: ListFilter, limit: int) -> dict[str, Any]:
    """The parameters of ``list_query(table, where)``."""
    params: dict[str, Any] = attrs.asdict(where, recurse=False)
    after = params.pop("after")
    if after is not None:
        params["after_at"], params["after_id"] = after
    return {**params, "limit": limit}


def list_page(conn: psycopg.Connection[Any], table: SagaTable, where: ListFilter, limit: int) -> list[SagaRow]:
    """Up to ``limit`` sagas matching ``where``, newest first (``started_at``, then ``saga_id``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(list_query(table, where), list_params(where, limit))
        return [SagaRow.from_row(row) for row in cur.fetchall()]
