"""The event store of a service schema: appends with optimistic concurrency, reads, snapshots.

Functions take the caller's connection and the service schema, and join the caller's
transaction (nothing here commits, except :func:`high_water_mark`, which needs an
autocommit connection). The tables are those of ``sql/migrations/_events``.

Reading order. Positions are drawn from a sequence while transactions are still open, so
they become visible out of order: a reader that follows ``position > last`` skips a
position that commits after a larger one was read. Two safe ways to read the whole log:

- :func:`read_safe`: rows of ended transactions only (``tx_id`` below the oldest running
  transaction id of the server), in ``(tx_id, position)`` order, checkpointed as that pair;
- :func:`high_water_mark`, then :func:`read_positions` up to it: an integer position below
  which nothing can still appear.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb

from . import plan
from .queries import query

#: The channel the ``events_wake`` trigger NOTIFYs at commit (payload: the schema).
WAKE_CHANNEL = "estafeta_events"

#: The transaction-local setting that lets ``UPDATE`` and ``DELETE`` on ``events`` through
#: (``sql/migrations/_events/0002_events_append_only.sql``); see :func:`allow_rewrite`.
REWRITE_SETTING = "estafeta.events_rewrite"

_FILE = "events.sql"
_NO_LIMIT = 2**62
_END_OF_TIME = "infinity"


def _query(name: str, schema: str) -> bytes:
    return query(name, schema, _FILE)


@attrs.frozen
class NewEvent:
    """An event to append, already in its stored form."""

    event_id: uuid.UUID
    #: The registered type name (``OrderCreated``).
    type: str
    #: The version of the type's schema the data is written in.
    schema_version: int
    data: dict[str, Any]
    #: ``causation_id``, ``correlation_id``, ``traceparent`` and anything the caller adds.
    metadata: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Appended:
    """Where an appended event landed."""

    position: int
    version: int
    tx_id: int
    recorded_at: datetime


@attrs.frozen
class StoredEvent:
    """An event as stored: its place in the log, its stream, type, data and metadata."""

    #: The global position (unique; gaps where transactions rolled back).
    position: int
    #: The id of the transaction that appended it.
    tx_id: int
    stream_id: str
    #: Its place in the stream: 1 for the first event.
    version: int
    event_id: uuid.UUID
    type: str
    schema_version: int
    #: ``None`` when read by a reader that asked only for other types' data.
    data: dict[str, Any] | None
    metadata: dict[str, Any]
    recorded_at: datetime

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoredEvent:
        """Build from a row of the read queries (their columns in field order, the JSON ones as text)."""
        data, metadata = row[7], row[8]
        return cls(
            row[0], row[1], row[2], row[3], row[4], row[5], row[6],
            None if data is None else json.loads(data),
            {} if metadata == "{}" else json.loads(metadata),
            row[9],
        )  # fmt: skip


@attrs.frozen
class StreamState:
    """A stream's row: its version, its type, and whether a newer transaction wrote it last."""

    version: int
    type: str
    last_tx_id: int
    #: The stream's last append came from a transaction newer than the caller's.
    newer_writer: bool


def append(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    events: Sequence[NewEvent],
    *,
    expected: int | None,
    stream_type: str,
) -> list[Appended] | None:
    """Append ``events`` to ``stream_id`` in the caller's transaction; ``None`` on a conflict.

    ``expected`` is the version the stream must be at: ``0`` for "no stream yet", ``None``
    for any. A conflict writes nothing and leaves the transaction usable. The stream's row
    stays locked until the transaction ends, so a concurrent appender of the same stream
    waits, then conflicts. Events are never inserted with ``ON CONFLICT DO NOTHING``: a
    duplicate version or event id is an error, never a silent loss.
    """
    result = plan.execute(conn, append_statement(schema, stream_id, events, expected=expected, stream_type=stream_type))
    return appended(result)


@functools.cache
def _append_query(variant: str, schema: str) -> bytes:
    return b"WITH stream AS (" + _query(variant, schema) + b") " + _query("insert_events", schema)


def append_statement(
    schema: str, stream_id: str, events: Sequence[NewEvent], *, expected: int | None, stream_type: str
) -> plan.Statement:
    """The one statement of :func:`append`, for a plan; :func:`appended` reads its result."""
    if not events:
        raise ValueError(f"nothing to append to stream {stream_id!r}")
    variant = "stream_any" if expected is None else "stream_new" if expected == 0 else "stream_expected"
    statement = _append_query(variant, schema)
    params = {
        "stream_id": stream_id,
        "stream_type": stream_type,
        "expected": expected,
        "count": len(events),
        "event_ids": [e.event_id for e in events],
        "types": [e.type for e in events],
        "schema_versions": [e.schema_version for e in events],
        "data": Jsonb([e.data for e in events]),
        "metadata": Jsonb([e.metadata for e in events]),
    }
    return plan.Statement(statement, params, plan.Fetch.DICTS)


def appended(result: plan.Result | None) -> list[Appended] | None:
    """Where :func:`append_statement`'s events landed; ``None`` on a conflict (nothing written)."""
    assert result is not None
    return [Appended(**row) for row in result.rows] or None


def stream_state(conn: psycopg.Connection[Any], schema: str, stream_id: str) -> StreamState | None:
    """The stream's current row, or ``None`` if it has no event."""
    return plan.run(conn, stream_state_plan(schema, stream_id))


def stream_state_plan(schema: str, stream_id: str) -> plan.Plan[StreamState | None]:
    """:func:`stream_state`, as a plan."""
    result = yield plan.Statement(_query("stream_state", schema), {"stream_id": stream_id}, plan.Fetch.DICTS)
    row = result.first()
    return None if row is None else StreamState(**row)


def read_stream(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    *,
    after_version: int = 0,
    up_to_version: int | None = None,
    up_to_position: int | None = None,
    as_of: datetime | None = None,
) -> list[StoredEvent]:
    """The events of one stream in version order, optionally cut at a version, position or time.

    A stream's versions, positions and record times grow together, so each cut is a prefix
    of the stream.
    """
    params = {
        "stream_id": stream_id,
        "after_version": after_version,
        "up_to_version": _NO_LIMIT if up_to_version is None else up_to_version,
        "up_to_position": _NO_LIMIT if up_to_position is None else up_to_position,
        "as_of": _END_OF_TIME if as_of is None else as_of,
    }
    return _read(conn, "read_stream", schema, params)


def version_as_of(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    *,
    as_of: datetime | None = None,
    up_to_position: int | None = None,
) -> int:
    """The stream's version at time ``as_of`` or at global position ``up_to_position`` (0 before it began)."""
    params = {
        "stream_id": stream_id,
        "as_of": _END_OF_TIME if as_of is None else as_of,
        "up_to_position": _NO_LIMIT if up_to_position is None else up_to_position,
    }
    row = conn.execute(_query("version_as_of", schema), params).fetchone()
    return int(row[0]) if row else 0


def read_positions(
    conn: psycopg.Connection[Any], schema: str, *, after: int = 0, up_to: int | None = None, limit: int = 1000
) -> list[StoredEvent]:
    """Events with ``after < position <= up_to`` in position order.

    Final only when ``up_to`` is at most a :func:`high_water_mark`; above it a smaller
    position may still commit after this read.
    """
    params = {"after": after, "up_to": _NO_LIMIT if up_to is None else up_to, "limit": limit}
    return _read(conn, "read_positions", schema, params)


def read_safe(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    after: tuple[int, int] = (0, 0),
    limit: int = 1000,
    types: Collection[str] | None = None,
) -> list[StoredEvent]:
    """Up to ``limit`` events after the checkpoint ``after`` = ``(tx_id, position)``, gap-safe.

    Only events of transactions that have ended are returned, in ``(tx_id, position)``
    order, and every transaction still running (or not yet begun) has a larger id than
    any of them: nothing can later appear before the last event returned, so checkpointing
    its ``(tx_id, position)`` skips nothing. Each stream's events come in version order.
    With ``types``, events of other types come with ``data=None`` (the checkpoint still
    moves past them).
    """
    params = {
        "after_tx_id": after[0],
        "after_position": after[1],
        "limit": limit,
        "all_types": types is None,
        "types": list(types or ()),
    }
    return _read(conn, "read_safe", schema, params)


def held_back(conn: psycopg.Connection[Any], schema: str, *, after: tuple[int, int]) -> int:
    """Committed events after ``after`` that :func:`read_safe` cannot return yet (an older transaction runs)."""
    row = conn.execute(_query("held_back", schema), {"after_tx_id": after[0], "after_position": after[1]}).fetchone()
    return int(row[0]) if row else 0


def last_position(conn: psycopg.Connection[Any], schema: str) -> int:
    """The largest position drawn so far (committed, running or rolled back); 0 for none."""
    row = conn.execute(_query("last_position", schema)).fetchone()
    return int(row[0]) if row else 0


def high_water_mark(
    conn: psycopg.Connection[Any], schema: str, *, timeout: float = 10.0, poll: float = 0.002
) -> int | None:
    """A position ``H`` such that no event with a position up to ``H`` can still appear.

    ``conn`` must be in autocommit mode. Returns ``None`` if a transaction that was
    running when the call began is still running after ``timeout`` seconds (see
    :func:`estafeta_sql.projection_store.oldest_writer` for which one).

    How: read the sequence's last value ``S``; then take a transaction id ``R`` of our own
    (a transaction that ends at once). Every writer that drew a position up to ``S`` took
    its transaction id before drawing it (the append statement takes it first), hence
    before ``R``; once the oldest running transaction id of the server is at least ``R``,
    all of them have ended, and every position up to ``S`` is committed or rolled back for
    good. ``pg_snapshot_xmax`` cannot stand in for ``R``: it is the last *completed*
    transaction id plus one, and a writer still running may hold an id at or above it.
    """
    if not conn.autocommit:
        raise ValueError("high_water_mark needs an autocommit connection (it runs a transaction of its own)")
    mark = last_position(conn, schema)
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    ours = int(row[0])
    deadline = time.monotonic() + timeout
    while True:
        done = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::text::xid8", (ours,)).fetchone()
        if done and done[0]:
            return mark
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)
        poll = min(poll * 2, 0.05)


def allow_rewrite(conn: psycopg.Connection[Any]) -> None:
    """Let this transaction (only) update or delete rows of ``events``: pruning, crypto-shredding.

    The event store refuses ``UPDATE`` and ``DELETE`` on ``events`` otherwise. The
    permission is ``SET LOCAL``: it ends with the transaction, so it never outlives the
    code that asked for it, nor passes to the next user of a pooled connection. ``conn``
    must be in a transaction (on an autocommit connection the setting would end at once).
    """
    if conn.autocommit and conn.info.transaction_status != pq.TransactionStatus.INTRANS:
        raise ValueError("allow_rewrite needs a transaction (`with conn.transaction():`): it lasts until its end")
    conn.execute("SELECT set_config(%s, 'on', true)", (REWRITE_SETTING,))


def put_snapshot(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    *,
    aggregate: str,
    schema_version: int,
    version: int,
    fingerprint: str,
    state: dict[str, Any],
) -> None:
    """Store the state of ``aggregate`` after ``version`` events of ``stream_id``, in the caller's transaction."""
    params = {
        "stream_id": stream_id,
        "aggregate": aggregate,
        "schema_version": schema_version,
        "version": version,
        "fingerprint": fingerprint,
        "state": Jsonb(state),
    }
    conn.execute(_query("insert_snapshot", schema), params)


def latest_snapshot(
    conn: psycopg.Connection[Any],
    schema: str,
    stream_id: str,
    *,
    aggregate: str,
    schema_version: int,
    up_to_version: int | None = None,
) -> tuple[int, str, dict[str, Any]] | None:
    """``(version, fingerprint, state)`` of the newest snapshot at or before ``up_to_version``, if any."""
    params = {
        "stream_id": stream_id,
        "aggregate": aggregate,
        "schema_version": schema_version,
        "up_to_version": _NO_LIMIT if up_to_version is None else up_to_version,
    }
    row = conn.execute(_query("latest_snapshot", schema), params).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), row[2])


def _read(conn: psycopg.Connection[Any], name: str, schema: str, params: dict[str, Any]) -> list[StoredEvent]:
    with conn.cursor() as cur:
        cur.execute(_query(name, schema), params)
        return [StoredEvent.from_row(row) for row in cur.fetchall()]
