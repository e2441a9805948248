"""Projection checkpoints, dead letters, lag, and the server's oldest running writer.

A projector locks its checkpoint row at the start of every batch and moves it in the
batch's transaction, together with the read model's writes (``sql/projections.sql``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from .event_store import StoredEvent
from .queries import query

_FILE = "projections.sql"

#: ``lag`` counts waiting events up to this many (an exact count of a huge backlog is slow).
LAG_COUNT_CAP = 1_000_000


def _query(name: str, schema: str) -> bytes:
    return query(name, schema, _FILE)


@attrs.frozen
class Checkpoint:
    """Where a projection is in the log."""

    projection: str
    #: The last event applied, in ``(tx_id, position)`` order; ``(0, 0)`` before the first.
    tx_id: int
    position: int
    events_applied: int
    #: ``running``, ``failed`` (stopped on a bad event) or ``rebuilding``.
    state: str
    last_error: str | None
    error_position: int | None
    updated_at: datetime | None = None

    @property
    def after(self) -> tuple[int, int]:
        """The ``(tx_id, position)`` pair to read after."""
        return (self.tx_id, self.position)


@attrs.frozen
class OldestWriter:
    """The running transaction with the server's oldest transaction id (a backend or a prepared one)."""

    xid: int
    age_seconds: float
    #: ``None`` for a prepared (two-phase) transaction, which has no backend.
    pid: int | None
    database: str | None
    application_name: str | None
    #: ``active``, ``idle in transaction``...; ``prepared`` for a prepared transaction.
    state: str | None


def ensure_checkpoint(conn: psycopg.Connection[Any], schema: str, projection: str, state: str = "running") -> None:
    """Create the projection's checkpoint row at the start of the log, unless it exists."""
    conn.execute(_query("ensure_checkpoint", schema), {"projection": projection, "state": state})


def lock_checkpoint(conn: psycopg.Connection[Any], schema: str, projection: str) -> Checkpoint | None:
    """The projection's checkpoint, read after taking its lock (held until the caller's transaction ends).

    The lock is a transaction-scoped advisory lock, which, unlike a row lock, gives the
    transaction no id: the batch reads the log before it holds anyone's horizon back.
    """
    key = f"estafeta.checkpoint:{schema}.{projection}"
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_query("lock_checkpoint", schema), {"projection": projection}).fetchone()
    return None if row is None else Checkpoint(**row)


def advance_checkpoint(
    conn: psycopg.Connection[Any], schema: str, projection: str, *, after: tuple[int, int], applied: int
) -> bool:
    """Move the checkpoint to ``after`` and count ``applied`` events; ``False`` if that would move it back.

    A failed projection that moves on is running again (its error is cleared).
    """
    params = {"projection": projection, "tx_id": after[0], "position": after[1], "applied": applied}
    return conn.execute(_query("advance_checkpoint", schema), params).rowcount == 1


def mark_failed(
    conn: psycopg.Connection[Any], schema: str, projection: str, *, error: str, position: int | None
) -> None:
    """Record that the projection stopped on the event at ``position`` (``None``: before any event), and why."""
    conn.execute(_query("mark_failed", schema), {"projection": projection, "error": error, "position": position})


def clear_setup_failure(conn: psycopg.Connection[Any], schema: str, projection: str) -> None:
    """Mark a projection that had failed before any event (its tables) running again; a bad event's failure stays."""
    conn.execute(_query("clear_setup_failure", schema), {"projection": projection})


def dead_letter(conn: psycopg.Connection[Any], schema: str, projection: str, event: StoredEvent, reason: str) -> None:
    """Record an event the projection skipped, with the reason."""
    params = {
        "projection": projection,
        "position": event.position,
        "tx_id": event.tx_id,
        "stream_id": event.stream_id,
        "version": event.version,
        "type": event.type,
        "reason": reason,
    }
    conn.execute(_query("insert_dead_letter", schema), params)


def adopt_checkpoint(conn: psycopg.Connection[Any], schema: str, projection: str, rebuild: str) -> None:
    """Give ``projection`` the checkpoint of ``rebuild`` and delete the latter (a rebuild's switch-over)."""
    conn.execute(_query("adopt_checkpoint", schema), {"projection": projection, "rebuild": rebuild})
    delete_checkpoint(conn, schema, rebuild)


def delete_checkpoint(conn: psycopg.Connection[Any], schema: str, projection: str) -> None:
    """Forget a projection's checkpoint (its next run starts from the beginning of the log)."""
    conn.execute(_query("delete_checkpoint", schema), {"projection": projection})


def list_checkpoints(conn: psycopg.Connection[Any], schema: str) -> list[Checkpoint]:
    """Every checkpoint of the schema, by name."""
    with conn.cursor(row_factory=dict_row) as cur:
        return [Checkpoint(**row) for row in cur.execute(_query("list_checkpoints", schema)).fetchall()]


def lag(
    conn: psycopg.Connection[Any], schema: str, after: tuple[int, int], cap: int = LAG_COUNT_CAP
) -> tuple[int, float]:
    """Events after ``after`` not applied yet (at most ``cap``), and the age in seconds of the next one."""
    params = {"tx_id": after[0], "position": after[1], "cap": cap}
    row = conn.execute(_query("lag", schema), params).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def dependents(conn: psycopg.Connection[Any], tables: list[str]) -> list[str]:
    """What depends on ``tables`` (qualified, quoted names) besides themselves: views, foreign keys of other tables...

    Each as PostgreSQL describes it (``view public.v``); dropping the tables with CASCADE would drop these.
    """
    rows = conn.execute(_query("dependents", "public"), {"tables": tables}).fetchall()
    return [f"{what} depends on {table}" for what, table in rows]


def lock_holder(conn: psycopg.Connection[Any], key: str) -> int | None:
    """The pid of the backend holding the session advisory lock ``hashtextextended(key, 0)``, if any."""
    row = conn.execute(_query("lock_holder", "public"), {"key": key}).fetchone()
    return None if row is None else int(row[0])


def oldest_writer(conn: psycopg.Connection[Any]) -> OldestWriter | None:
    """The running transaction (a backend's or a prepared one) that holds the oldest transaction id, if any."""
    with conn.cursor(row_factory=dict_row) as cur:
        active = cur.execute(_query("oldest_writer", "public")).fetchone()
        prepared = cur.execute(_query("oldest_prepared", "public")).fetchone()
    found = []
    if active is not None:
        found.append(OldestWriter(**{**active, "xid": int(active["xid"])}))
    if prepared is not None:
        found.append(
            OldestWriter(
                int(prepared["xid"]), prepared["age_seconds"], None, prepared["database"], prepared["gid"], "prepared"
            )
        )
    return min(found, key=lambda w: w.xid, default=None)
