"""What operators and apps do with an outbox besides sending and relaying: look, cancel, reschedule, retry.

Apart from :mod:`estafeta_sql.outbox` (the rows written in a business transaction, and the relay's
claim, publish bookkeeping and delete): these read what waits in an outbox (scheduled
rows, failed rows, counts) for the CLI, the console and the metrics, and change rows not
yet published (cancel or reschedule a scheduled message, retry failed rows), each on the
caller's connection and in the caller's transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from . import plan
from .errors import MessageAlreadyPublished, MessageBeingPublished, ScheduledMessageRefused
from .outbox import WAKE_CHANNEL
from .queries import query


@attrs.frozen
class ScheduledRow:
    """A pending outbox row whose time (``send(..., delay=/at=)``) is not here yet."""

    #: The id ``send`` returned: what cancel and reschedule take.
    message_id: uuid.UUID
    #: The row's id (as ``estafeta outbox failed`` shows ids).
    id: int
    queue_name: str
    actor_name: str
    #: The command's class, ``module.Class`` (``None``: written before types were recorded).
    message_type: str | None
    ordering_key: str | None
    saga_id: uuid.UUID | None
    created_at: datetime
    #: When the relay publishes it, by the schema's clock.
    available_at: datetime


def list_scheduled(conn: psycopg.Connection[Any], schema: str, limit: int = 100) -> list[ScheduledRow]:
    """``schema``'s rows waiting for their time, soonest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_scheduled", schema), {"limit": limit})
        return [ScheduledRow(**row) for row in cur.fetchall()]


def cancel_plan(schema: str, message_id: uuid.UUID) -> plan.Plan[None]:
    """Delete the row of ``message_id`` from ``schema``'s outbox, in the caller's transaction.

    Raises :class:`MessageBeingPublished` when a relay holds the row (it is being
    published now) and :class:`MessageAlreadyPublished` when there is no row. Never waits
    for a relay's lock. Until the caller commits, relays skip the row; a rollback puts it back.
    """
    done = yield plan.Statement(query("cancel_outbox", schema), {"message_id": message_id}, plan.Fetch.ROWS)
    if not done.rows:
        yield from _refuse(schema, message_id, "cancel")


def reschedule_plan(schema: str, message_id: uuid.UUID, at: datetime) -> plan.Plan[None]:
    """Make the pending row of ``message_id`` due at ``at`` (by the schema's clock), in the caller's transaction.

    Refuses as :func:`cancel_plan` does, and with :class:`ScheduledMessageRefused` for a
    row that failed (``estafeta outbox retry`` puts those back). ``at`` in the past makes
    it due now.
    """
    if at.tzinfo is None:
        raise ValueError(f"reschedule to {at!r}: give a timezone-aware datetime (e.g. tzinfo=UTC)")
    params = {"message_id": message_id, "at": at, "channel": WAKE_CHANNEL, "schema_name": schema}
    done = yield plan.Statement(query("reschedule_outbox", schema), params, plan.Fetch.ROWS)
    if not done.rows:
        yield from _refuse(schema, message_id, "reschedule")


def _refuse(schema: str, message_id: uuid.UUID, what: str) -> plan.Plan[None]:
    """Raise the reason ``what`` found no row of ``message_id`` it could change."""
    found = yield plan.Statement(query("outbox_row_status", schema), {"message_id": message_id}, plan.Fetch.ROWS)
    row = found.first()
    if row is None:
        raise MessageAlreadyPublished(
            f"cannot {what} message {message_id}: not in {schema}'s outbox"
            " (already published, cancelled, or never sent)"
        )
    if row[0] == "failed":
        raise ScheduledMessageRefused(
            f"cannot {what} message {message_id}: its publish failed for good; cancel it, or"
            " `estafeta outbox retry` its row"
        )
    raise MessageBeingPublished(
        f"cannot {what} message {message_id}: already being published (a relay holds its row right now;"
        " or another transaction is changing it)"
    )


def retry_failed(conn: psycopg.Connection[Any], schema: str, row_id: int | None = None) -> list[int]:
    """Put failed rows (one, or all with ``row_id=None``) back to pending; return their ids."""
    rows = conn.execute(query("retry_failed", schema), {"id": row_id}).fetchall()
    if rows:
        conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, schema))
    return [int(r[0]) for r in rows]


def list_failed(
    conn: psycopg.Connection[Any], schema: str, limit: int = 100, row_id: int | None = None
) -> list[dict[str, Any]]:
    """Failed rows (all, or the one with ``row_id``) with their last error and message, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_failed", schema), {"limit": limit, "id": row_id})
        return cur.fetchall()


@attrs.frozen
class OutboxStats:
    """What is waiting in one outbox, and why."""

    #: Rows not yet published (due, delayed or waiting for a retry).
    pending: int
    #: Rows that exhausted their attempts; ``estafeta outbox retry`` puts them back.
    failed: int
    #: Pending rows the broker refused at least once, waiting for their next attempt.
    retrying: int
    #: Pending rows sent with a delay that is not over yet.
    delayed: int
    #: Ordering keys stopped behind a failed row (their later rows wait for it).
    blocked_keys: int
    #: How long the longest-waiting row that should be out by now has waited.
    oldest_pending_age_seconds: float
    #: The last error of the oldest row that has one (why things are stuck).
    oldest_error: str | None


def stats(conn: psycopg.Connection[Any], schema: str) -> OutboxStats:
    """Counts of what is waiting, the age of the longest wait, and the oldest error."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("outbox_stats", schema))
        row = cur.fetchone()
    assert row is not None
    return OutboxStats(**row)


@attrs.frozen
class TypeStats:
    """What waits in one outbox for one message type."""

    #: The command or event class (``module.Class``); ``None`` for rows written before the
    #: type was recorded.
    message_type: str | None
    #: Rows of the type not yet published, and rows out of attempts.
    pending: int
    failed: int
    #: When the oldest row of the type still in the outbox was written.
    oldest_created_at: datetime


def stats_by_type(conn: psycopg.Connection[Any], schema: str) -> list[TypeStats]:
    """What waits in ``schema``'s outbox, per message type, the types with the most rows first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("outbox_stats_by_type", schema))
        return [TypeStats(**row) for row in cur.fetchall()]
