"""What operators ask of a saga table: lists, filtered pages, counts per status, stalls, latency, outcomes.

Apart from :mod:`estafeta_sql.sagas` (the table, its rows and the reads the orchestrator and the
watchdog act on): these serve the CLI, the console, the metrics and the demo, read only,
on the caller's connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from .sagas import SagaRow, SagaTable, query


def search(
    conn: psycopg.Connection[Any], table: SagaTable, *, status: str | None, stuck: bool, limit: int
) -> list[SagaRow]:
    """Sagas, newest first: all, or those in ``status``, or (``stuck``) live ones past their deadline."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_sagas", table), {"status": status, "stuck": stuck, "limit": limit})
        return [SagaRow.from_row(row) for row in cur.fetchall()]


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


def count_ended(conn: psycopg.Connection[Any], table: SagaTable, saga_ids: Sequence[uuid.UUID]) -> int:
    """How many of ``saga_ids`` have ended or were given up (at rest until a late answer or an operator)."""
    found = conn.execute(query("count_ended", table), {"ids": list(saga_ids)}).fetchone()
    return int(found[0]) if found else 0


def outcomes(
    conn: psycopg.Connection[Any], table: SagaTable, saga_ids: Sequence[uuid.UUID]
) -> list[tuple[str, str | None]]:
    """(status, last_error) of each of ``saga_ids``."""
    return [(str(s), e) for s, e in conn.execute(query("outcomes", table), {"ids": list(saga_ids)}).fetchall()]


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
    #: ``True``: only live sagas past their deadline (as ``estafeta sagas list --stuck``).
    stuck: bool | None = None


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
    "stuck": "status IN ('running', 'compensating') AND deadline_at <= {schema}.clock_now()",
}


def list_query(table: SagaTable, where: ListFilter) -> sql.Composed:
    """The statement of one page of ``where``'s sagas, newest first (its parameters: ``list_params``)."""
    given = [name for name in _CONDITIONS if getattr(where, name) not in (None, False)]
    schema = sql.Identifier(table.schema)
    conditions = (
        sql.SQL(" AND ").join(sql.SQL(_CONDITIONS[name]).format(schema=schema) for name in given)
        if given
        else sql.SQL("true")
    )
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
    params.pop("stuck")
    if after is not None:
        params["after_at"], params["after_id"] = after
    return {**params, "limit": limit}


def list_page(conn: psycopg.Connection[Any], table: SagaTable, where: ListFilter, limit: int) -> list[SagaRow]:
    """Up to ``limit`` sagas matching ``where``, newest first (``started_at``, then ``saga_id``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(list_query(table, where), list_params(where, limit))
        return [SagaRow.from_row(row) for row in cur.fetchall()]
