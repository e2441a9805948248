"""The eventsourcing library's recorders on a service's event store: writes, reads, tracking, snapshots.

Functions take the caller's connection and the service schema and join the caller's
transaction; none commits. The tables are those of ``sql/migrations/_events`` and
``sql/migrations/_eventsourcing``; the queries are in ``sql/eventsourcing.sql``.
:mod:`estafeta.eventsourcing` maps the library's types onto these rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg.types.json import Jsonb

from .queries import query

_FILE = "eventsourcing.sql"
_NO_LIMIT = 2**62


def _query(name: str, schema: str) -> bytes:
    return query(name, schema, _FILE)


@attrs.frozen
class EventRow:
    """One event as the adapter stores it."""

    stream_id: str
    #: The stream version (the library's originator_version + 1).
    version: int
    #: The library's topic, stored as the event's type.
    type: str
    #: A JSON object, or a string (the base64 of bytes that are not a JSON object).
    data: Any


@attrs.frozen
class ReadRow:
    """An event read back: ``data`` is the stored JSON as text; ``position`` is 0 for stream reads."""

    stream_id: str
    version: int
    type: str
    data: str
    position: int = 0


class StreamOrderRefused(Exception):
    """A stream's last events came from a transaction newer than this one (retry in a new transaction)."""


def insert_events(conn: psycopg.Connection[Any], schema: str, rows: Sequence[EventRow]) -> list[int]:
    """Insert ``rows`` in ``conn``'s transaction; their positions, in the order of ``rows``.

    Must run inside a transaction (positions must not be drawn before the transaction id).
    Locks each stream's row first, then draws the batch's positions under a session
    advisory lock held only while the events are inserted, so a batch's positions are
    contiguous among the adapter's writers; the lock never waits for a commit. A duplicate
    ``(stream_id, version)`` raises psycopg's ``UniqueViolation`` (the batch's savepoint is
    rolled back and the lock released first). :class:`StreamOrderRefused` if a stream was
    last written by a newer transaction.
    """
    latest: dict[str, int] = {}
    for row in rows:
        latest[row.stream_id] = max(row.version, latest.get(row.stream_id, 0))
    claimed = conn.execute(
        _query("claim_streams", schema), {"stream_ids": list(latest), "versions": list(latest.values())}
    ).fetchall()
    refused = set(latest) - {r[0] for r in claimed}
    if refused:
        raise StreamOrderRefused(
            f"streams {sorted(refused)} in {schema} were last appended by a transaction newer than this one;"
            " retry in a new transaction"
        )
    params = {
        "stream_ids": [r.stream_id for r in rows],
        "versions": [r.version for r in rows],
        "types": [r.type for r in rows],
        "data": Jsonb([r.data for r in rows]),
    }
    conn.execute(_query("lock_positions", schema), {"schema_name": schema})
    try:
        with conn.transaction():
            inserted = conn.execute(_query("insert_events", schema), params).fetchall()
    finally:
        conn.execute(_query("unlock_positions", schema), {"schema_name": schema})
    positions = {(stream_id, version): position for stream_id, version, position in inserted}
    return [positions[(r.stream_id, r.version)] for r in rows]


def select_stream(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    *,
    after: int | None,
    up_to: int | None,
    desc: bool,
    limit: int | None,
) -> list[ReadRow]:
    """A stream's events with ``after < version <= up_to``, in version order (or the reverse)."""
    name = f"select_stream_{'desc' if desc else 'asc'}"
    params = _range(stream_id, after, up_to, limit)
    return [ReadRow(*row) for row in conn.execute(_query(name, schema), params).fetchall()]


def select_snapshots(
    conn: psycopg.Connection[Any],
    schema: str,
    originator_id: str,
    *,
    after: int | None,
    up_to: int | None,
    desc: bool,
    limit: int | None,
) -> list[tuple[str, int, str, bytes]]:
    """The library's snapshots ``(originator_id, originator_version, topic, state)`` in version order."""
    name = f"select_snapshots_{'desc' if desc else 'asc'}"
    rows = conn.execute(_query(name, schema), _range(originator_id, after, up_to, limit)).fetchall()
    return [(str(r[0]), int(r[1]), str(r[2]), bytes(r[3])) for r in rows]


def _range(stream_id: str, after: int | None, up_to: int | None, limit: int | None) -> dict[str, Any]:
    return {
        "stream_id": stream_id,
        "after": -_NO_LIMIT if after is None else after,
        "up_to": _NO_LIMIT if up_to is None else up_to,
        "limit": _NO_LIMIT if limit is None else limit,
    }


def select_notifications(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    first: int,
    up_to: int,
    limit: int,
    topics: Sequence[str] = (),
) -> list[ReadRow]:
    """Events with ``first <= position <= up_to`` (of the given types, if any), in position order."""
    params = {"first": first, "up_to": up_to, "limit": limit, "all_topics": not topics, "topics": list(topics)}
    rows = conn.execute(_query("select_notifications", schema), params).fetchall()
    return [ReadRow(stream_id, version, type_, data, position) for position, stream_id, version, type_, data in rows]


def max_position(conn: psycopg.Connection[Any], schema: str, *, up_to: int) -> int | None:
    """The largest position of an event at or below ``up_to``; ``None`` if there is none."""
    row = conn.execute(_query("max_position", schema), {"up_to": up_to}).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def insert_tracking(conn: psycopg.Connection[Any], schema: str, application_name: str, notification_id: int) -> bool:
    """Move ``application_name``'s position to ``notification_id``; ``False`` if it is already there or past it."""
    params = {"application_name": application_name, "notification_id": notification_id}
    return conn.execute(_query("insert_tracking", schema), params).fetchone() is not None


def max_tracking_id(conn: psycopg.Connection[Any], schema: str, application_name: str) -> int | None:
    """``application_name``'s recorded position, or ``None``."""
    row = conn.execute(_query("max_tracking_id", schema), {"application_name": application_name}).fetchone()
    return None if row is None else int(row[0])


def insert_snapshots(conn: psycopg.Connection[Any], schema: str, rows: Sequence[tuple[str, int, str, bytes]]) -> None:
    """Insert the library's snapshots ``(originator_id, originator_version, topic, state)``; duplicates raise."""
    stream_ids, versions, types, states = (list(column) for column in zip(*rows, strict=True))
    params = {"stream_ids": stream_ids, "versions": versions, "types": types, "states": states}
    conn.execute(_query("insert_snapshots", schema), params)
