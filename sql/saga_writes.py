"""Writes to a saga table and its log: a new saga, its transitions, re-sends, errors, and log retention.

Apart from :mod:`estafeta_sql.sagas` (the table, its rows and the reads of the orchestrator and the
watchdog): every function here changes rows, on the caller's connection and inside the
caller's transaction, so a transition commits or rolls back with the commands it sends. A
change to a row read under its lock checks the row's version and raises if it moved.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import plan, retention
from .sagas import SagaRow, SagaTable, fetch_row, query


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
    changed = fetch_row(conn, name, table, params)
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


def requeue_command(conn: psycopg.Connection[Any], schema: str, message_id: uuid.UUID) -> bool:
    """Put the outbox row of ``message_id`` back in line if it is still there; ``False`` if it is not."""
    table = SagaTable(schema, "outbox", "outbox", "id")
    return conn.execute(query("requeue_command", table), {"message_id": message_id}).fetchone() is not None


def prune_log(
    conn: psycopg.Connection[Any],
    table: SagaTable,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
) -> int:
    """Delete the log of sagas completed or compensated more than ``older_than`` ago; return how many rows.

    Failed, given-up and live sagas keep their log; saga rows are never deleted. With ``dry_run``,
    count instead.
    """
    params = {"older_than": older_than, "batch": batch_size}
    if dry_run:
        return retention.count(conn, query("count_prunable_log", table), params)
    return retention.delete_in_batches(conn, query("prune_log", table), params)
