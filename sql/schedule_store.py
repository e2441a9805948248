"""The schedules table of a service schema (``migrations/_schedules``): its rows and named queries.

The queries live in ``schedules.sql``; this module runs them. Deciding which ticks to fire
is the runtime's (:mod:`estafeta.schedules.scheduler`); the row lock that makes one process fire
each tick is taken here (:func:`claim_due`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from .queries import query

_FILE = "schedules.sql"


@attrs.frozen
class ScheduleRow:
    """A schedule's stored state."""

    name: str
    #: The declaration ``next_fire_at`` was computed from.
    spec: str
    #: The next tick to fire.
    next_fire_at: datetime
    paused: bool
    #: The last tick fired and when it was fired (``None``: never).
    last_tick: datetime | None
    last_fired_at: datetime | None
    #: The message the last firing sent, and the step it went to.
    last_message_id: uuid.UUID | None
    last_actor: str | None
    #: What the last pass over a due tick (or an operator) did, and when.
    last_outcome: str | None
    last_outcome_at: datetime | None
    #: Ticks fired, skipped by the overlap policy, and missed by the catch-up policy.
    fired: int
    skipped: int
    missed: int
    created_at: datetime
    #: The tick a pass began to fire and has not committed (``None``: no firing under way or left unfinished).
    attempted_tick: datetime | None
    #: Since when the registering workers no longer declare it (``None``: declared).
    absent_since: datetime | None
    #: The schema's clock when the row was read.
    now: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ScheduleRow:
        """Build from a ``dict_row`` of the schedules table (plus ``now``)."""
        return cls(**row)


def _q(name: str, schema: str) -> Any:
    return query(name, schema, _FILE)


def register(
    conn: psycopg.Connection[Any],
    schema: str,
    name: str,
    spec: str,
    next_fire_at: datetime,
    *,
    absence: timedelta,
    restart: bool = False,
) -> None:
    """Create ``name``'s row at ``next_fire_at``, or restart it there.

    Restarted if its ``spec`` changed, if it was absent for longer than ``absence``, or if
    ``restart``; a shorter absence is forgotten.
    """
    params = {"name": name, "spec": spec, "next_fire_at": next_fire_at, "absence": absence}
    conn.execute(_q("restart_schedule" if restart else "register_schedule", schema), params)


def create(conn: psycopg.Connection[Any], schema: str, name: str, spec: str, next_fire_at: datetime) -> None:
    """Create ``name``'s row at ``next_fire_at`` if it has none; an existing row is left as it is."""
    conn.execute(_q("create_schedule", schema), {"name": name, "spec": spec, "next_fire_at": next_fire_at})


def mark_absent(conn: psycopg.Connection[Any], schema: str, declared: Sequence[str]) -> None:
    """Say since now that the rows of ``schema`` not in ``declared`` are absent (unless already said)."""
    conn.execute(_q("mark_absent_schedules", schema), {"declared": list(declared)})


def get(conn: psycopg.Connection[Any], schema: str, name: str) -> ScheduleRow | None:
    """``name``'s row as it is now, unlocked; ``None`` if it has none."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_q("get_schedule", schema), {"name": name}).fetchone()
    return None if row is None else ScheduleRow.from_row(row)


@attrs.frozen
class Attempt:
    """A pass's firing of a due schedule, begun (:func:`begin_attempt`)."""

    #: The tick an earlier pass began to fire and never committed (``None``: none).
    interrupted: datetime | None


def begin_attempt(conn: psycopg.Connection[Any], schema: str, name: str, spec: str) -> Attempt | None:
    """Write down, committed on its own, that a pass begins to fire ``name``'s due tick.

    ``None`` if it is not due, paused, declared otherwise than ``spec``, or being fired by
    another transaction. ``conn`` must be in autocommit mode: the mark must outlive a firing
    transaction that never commits.
    """
    row = conn.execute(_q("begin_attempt", schema), {"name": name, "spec": spec}).fetchone()
    return None if row is None else Attempt(interrupted=row[0])


def due(conn: psycopg.Connection[Any], schema: str, names: Sequence[str]) -> list[str]:
    """The names among ``names`` whose next tick has come (not paused), most overdue first."""
    return [r[0] for r in conn.execute(_q("due_schedules", schema), {"names": list(names)})]


def seconds_to_next(conn: psycopg.Connection[Any], schema: str, names: Sequence[str]) -> float | None:
    """Seconds until the next tick of one of ``names`` (negative: overdue; ``None``: none runs)."""
    row = conn.execute(_q("next_schedule_due", schema), {"names": list(names)}).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def claim_due(conn: psycopg.Connection[Any], schema: str, name: str) -> ScheduleRow | None:
    """Lock ``name``'s row if its tick has come and no other transaction holds it; ``None`` otherwise."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_q("claim_due_schedule", schema), {"name": name}).fetchone()
    return None if row is None else ScheduleRow.from_row(row)


def lock(conn: psycopg.Connection[Any], schema: str, name: str) -> ScheduleRow | None:
    """Lock ``name``'s row (waiting for a firing in progress); ``None`` if it has none."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_q("lock_schedule", schema), {"name": name}).fetchone()
    return None if row is None else ScheduleRow.from_row(row)


def list_all(conn: psycopg.Connection[Any], schema: str) -> list[ScheduleRow]:
    """Every schedule row of ``schema``, by name."""
    with conn.cursor(row_factory=dict_row) as cur:
        return [ScheduleRow.from_row(r) for r in cur.execute(_q("list_schedules", schema))]


@attrs.frozen
class Firing:
    """What one firing transaction did to a schedule, recorded on its row."""

    next_fire_at: datetime
    outcome: str
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    #: The last tick fired in it, the message sent for it and its step (``None``: none fired).
    last_tick: datetime | None = None
    last_message_id: uuid.UUID | None = None
    last_actor: str | None = None


def record(
    conn: psycopg.Connection[Any], schema: str, name: str, firing: Firing, *, keep_attempt: bool = False
) -> None:
    """Write ``firing`` on ``name``'s row, in the firing's transaction.

    It clears the tick a pass began to fire (:func:`begin_attempt`) unless ``keep_attempt``.
    """
    conn.execute(_q("record_firing", schema), {"name": name, "keep_attempt": keep_attempt, **attrs.asdict(firing)})


def set_paused(
    conn: psycopg.Connection[Any],
    schema: str,
    name: str,
    *,
    paused: bool,
    outcome: str,
    next_fire_at: datetime | None = None,
) -> None:
    """Pause or resume ``name`` (resuming at ``next_fire_at`` when given)."""
    params = {"name": name, "paused": paused, "outcome": outcome, "next_fire_at": next_fire_at}
    conn.execute(_q("set_schedule_paused", schema), params)


def outbox_status(conn: psycopg.Connection[Any], schema: str, message_id: uuid.UUID) -> str | None:
    """``pending`` or ``failed`` while ``message_id`` is in ``schema``'s outbox; ``None`` once it left."""
    row = conn.execute(_q("message_in_outbox", schema), {"message_id": message_id}).fetchone()
    return None if row is None else str(row[0])


def handled(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> str | None:
    """``processed`` or ``dead-lettered`` once ``consumer`` is done with ``message_id``; ``None`` before."""
    row = conn.execute(_q("message_handled", schema), {"consumer": consumer, "message_id": message_id}).fetchone()
    return None if row is None or row[0] is None else str(row[0])
