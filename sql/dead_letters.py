"""A service's dead letters: listed, read, and resolved (replayed or obsolete) once."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from .queries import query

#: What a dead letter can be: waiting for an operator, or resolved one of two ways.
STATUSES = ("parked", "replayed", "obsolete")


@attrs.frozen
class DeadLetterRow:
    """A dead letter as stored."""

    id: int
    #: The step (actor) that refused the message.
    consumer: str
    #: The message's id as delivered (text: it may not even be a UUID).
    message_id: str
    #: ``{"args": [...], "kwargs": {...}, "options": {...}}`` as delivered.
    message: dict[str, Any]
    reason: str
    created_at: datetime
    status: str
    resolved_at: datetime | None
    #: The message id its replay was sent under.
    replayed_as: uuid.UUID | None
    #: Why it was resolved the way it was (an obsolete saga command: the saga's state).
    note: str | None


@attrs.frozen
class CauseRow:
    """What grouping reads of a parked dead letter."""

    id: int
    consumer: str
    reason: str
    created_at: datetime


def search(conn: psycopg.Connection[Any], schema: str, *, status: str | None, limit: int) -> list[DeadLetterRow]:
    """Dead letters, newest first: all, or those in ``status``."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("search_dead_letters", schema), {"status": status, "limit": limit})
        return [DeadLetterRow(**row) for row in cur.fetchall()]


def causes(conn: psycopg.Connection[Any], schema: str) -> list[CauseRow]:
    """The parked dead letters' ids, consumers, reasons and times, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("dead_letter_causes", schema))
        return [CauseRow(**row) for row in cur.fetchall()]


def get(conn: psycopg.Connection[Any], schema: str, letter_id: int, *, lock: bool = False) -> DeadLetterRow | None:
    """One dead letter; with ``lock``, held until the caller's transaction ends."""
    if not lock:
        found = get_many(conn, schema, [letter_id])
        return found[0] if found else None
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("lock_dead_letter", schema), {"id": letter_id})
        row = cur.fetchone()
    return DeadLetterRow(**row) if row else None


def get_many(conn: psycopg.Connection[Any], schema: str, ids: list[int]) -> list[DeadLetterRow]:
    """The dead letters with these ids (those that exist), oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("get_dead_letters", schema), {"ids": ids})
        return [DeadLetterRow(**row) for row in cur.fetchall()]


def resolve(
    conn: psycopg.Connection[Any],
    schema: str,
    letter_id: int,
    status: str,
    *,
    replayed_as: uuid.UUID | None = None,
    note: str | None = None,
) -> bool:
    """Mark a parked dead letter ``replayed`` or ``obsolete``; ``False`` if it was not parked."""
    if status not in STATUSES[1:]:
        raise ValueError(f"a dead letter is resolved as replayed or obsolete, not {status!r}")
    params = {"id": letter_id, "status": status, "replayed_as": replayed_as, "note": note}
    return conn.execute(query("resolve_dead_letter", schema), params).rowcount == 1
