"""Heartbeat rows: which long-running processes serve a service, and when each last beat.

Each service schema has a ``heartbeats`` table (``migrations/_common/0014_heartbeats.sql``).
A process upserts its row every beat and deletes it when it stops cleanly; a row whose
``last_beat`` is older than :data:`MISSED_BEATS` of its own beat intervals, on the schema's
clock (``clock_now()``), belongs to a process that is gone or hung: stale.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg

from .queries import query

#: Beats a process may miss before its row reads as stale.
MISSED_BEATS = 3
_FILE = "heartbeats.sql"


@attrs.frozen
class Beat:
    """What one process says of itself in one role, every beat."""

    #: Made by the process at start (a pid may be reused).
    process_id: uuid.UUID
    #: ``worker``, ``relay``, ``projector``, ``scheduler`` or ``serve``.
    kind: str
    #: Queues, outboxes, projections or schedules it serves in this service.
    serves: Sequence[str]
    #: Worker threads, relay lanes, projections running.
    threads: int
    host: str
    pid: int
    version: str
    #: Seconds between its beats.
    beat_interval: float


@attrs.frozen
class HeartbeatRow:
    """A row of ``heartbeats``, with its age on the schema's clock."""

    process_id: uuid.UUID
    kind: str
    serves: tuple[str, ...]
    threads: int
    host: str
    pid: int
    version: str
    started_at: datetime
    last_beat: datetime
    beat_interval: float
    #: Seconds since its last beat.
    age_seconds: float
    #: Whether it beat within its last :data:`MISSED_BEATS` intervals.
    live: bool

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> HeartbeatRow:
        """From the columns of ``list_heartbeats``."""
        pid, kind, serves, threads, host, ospid, version, started, last, interval, age, live = row
        return cls(
            pid, kind, tuple(serves), int(threads), host, int(ospid), version, started, last, float(interval),
            float(age), bool(live),
        )  # fmt: skip


def beat(conn: psycopg.Connection[Any], schema: str, beats: Sequence[Beat]) -> None:
    """Record ``beats`` in ``schema``: the rows exist with ``last_beat`` = the schema's now."""
    params = [attrs.asdict(b, recurse=False) | {"serves": list(b.serves)} for b in beats]
    with conn.cursor() as cursor:
        cursor.executemany(query("beat", schema, _FILE), params)


def remove(conn: psycopg.Connection[Any], schema: str, process_id: uuid.UUID) -> int:
    """Delete the rows of ``process_id`` in ``schema`` (a clean stop); return how many."""
    return conn.execute(query("remove", schema, _FILE), {"process_id": process_id}).rowcount


def prune(conn: psycopg.Connection[Any], schema: str, older_than: timedelta) -> int:
    """Delete the rows that have not beat for ``older_than``; return how many."""
    return conn.execute(query("prune_heartbeats", schema, _FILE), {"older_than": older_than}).rowcount


def list_rows(conn: psycopg.Connection[Any], schema: str) -> list[HeartbeatRow]:
    """Every heartbeat row of ``schema``, by kind, host and pid."""
    rows = conn.execute(query("list_heartbeats", schema, _FILE), {"missed": MISSED_BEATS}).fetchall()
    return [HeartbeatRow.from_row(r) for r in rows]
