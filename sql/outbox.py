"""The outbox store: rows written inside a business transaction, drained by the relay."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from .queries import query

#: The channel a committed outbox write NOTIFYs (payload: the schema) to wake relays.
WAKE_CHANNEL = "estafeta_outbox"


@attrs.frozen
class OutgoingMessage:
    """A message to write into a service's outbox."""

    #: The Dramatiq message id the relay will publish with; consumers deduplicate on it.
    message_id: uuid.UUID
    #: The Dramatiq queue and actor that will receive it.
    queue_name: str
    actor_name: str
    #: Dramatiq's ``args``, ``kwargs`` and ``options``, JSON-ready.
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    options: dict[str, Any] = attrs.field(factory=dict)
    #: Rows with the same key reach the broker in commit order.
    ordering_key: str | None = None
    saga_id: uuid.UUID | None = None
    #: Not published before this much time has passed after the commit.
    delay: timedelta = timedelta(0)


@attrs.frozen
class OutboxRow:
    """A row the relay claimed."""

    #: The row's id (also its commit-order position within one key).
    id: int
    message_id: uuid.UUID
    queue_name: str
    actor_name: str
    #: ``{"args": [...], "kwargs": {...}, "options": {...}}``.
    message: dict[str, Any]
    ordering_key: str | None
    saga_id: uuid.UUID | None
    created_at: datetime
    attempts: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> OutboxRow:
        """Build from a ``dict_row`` of the ``claim_batch`` query."""
        return cls(**row)


def insert(conn: psycopg.Connection[Any], schema: str, message: OutgoingMessage) -> None:
    """Write ``message`` into ``schema``'s outbox on ``conn``, inside the caller's transaction.

    The caller's commit makes it visible to the relay; a rollback discards it with the
    rest of the transaction. The relay is woken by a NOTIFY that PostgreSQL delivers
    only at commit.
    """
    body = {"args": list(message.args), "kwargs": message.kwargs, "options": message.options}
    conn.execute(
        query("insert_outbox", schema),
        {
            "message_id": message.message_id,
            "queue_name": message.queue_name,
            "actor_name": message.actor_name,
            "message": Jsonb(body),
            "ordering_key": message.ordering_key,
            "saga_id": message.saga_id,
            "delay": message.delay,
        },
    )
    conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, schema))


def claim_batch(conn: psycopg.Connection[Any], schema: str, limit: int) -> list[OutboxRow]:
    """Lock up to ``limit`` due rows that may be published now, in per-key commit order.

    Must run inside a transaction; the rows stay locked (invisible to other relays'
    claims) until it ends.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("claim_batch", schema), {"limit": limit})
        claimed = [OutboxRow.from_row(row) for row in cur.fetchall()]
    keyed = [row for row in claimed if row.ordering_key is not None]
    if not keyed:
        return claimed
    held = {
        row[0]
        for row in conn.execute(
            query("held_back", schema),
            {"ids": [r.id for r in claimed], "keys": [r.ordering_key for r in claimed]},
        ).fetchall()
    }
    return [row for row in claimed if row.id not in held]


def delete_published(conn: psycopg.Connection[Any], schema: str, ids: Sequence[int]) -> None:
    """Delete rows the broker confirmed."""
    if ids:
        conn.execute(query("delete_published", schema), {"ids": list(ids)})


def record_publish_failure(
    conn: psycopg.Connection[Any],
    schema: str,
    ids: Sequence[int],
    error: str,
    *,
    max_attempts: int,
    backoff: timedelta,
) -> None:
    """Count a failed publish of ``ids``; a row reaching ``max_attempts`` becomes ``failed``."""
    if ids:
        conn.execute(
            query("record_publish_failure", schema),
            {"ids": list(ids), "error": error, "max_attempts": max_attempts, "backoff": backoff},
        )


def retry_failed(conn: psycopg.Connection[Any], schema: str, row_id: int | None = None) -> list[int]:
    """Put failed rows (one, or all with ``row_id=None``) back to pending; return their ids."""
    rows = conn.execute(query("retry_failed", schema), {"id": row_id}).fetchall()
    if rows:
        conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, schema))
    return [int(r[0]) for r in rows]


def list_failed(conn: psycopg.Connection[Any], schema: str, limit: int = 100) -> list[dict[str, Any]]:
    """Failed rows with their last error, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_failed", schema), {"limit": limit})
        return cur.fetchall()


@attrs.frozen
class OutboxStats:
    """What is waiting in one outbox."""

    pending: int
    failed: int
    oldest_pending_age_seconds: float


def stats(conn: psycopg.Connection[Any], schema: str) -> OutboxStats:
    """Pending and failed counts and the age of the oldest pending row."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("outbox_stats", schema))
        row = cur.fetchone()
    assert row is not None
    return OutboxStats(**row)
