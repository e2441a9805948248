"""A service schema's clock: what every time-based decision in its queries reads.

Each service schema carries ``clock_now()`` (``migrations/_common/0007_clock.sql``):
PostgreSQL's ``now()`` plus the skew stored in the schema's one-row ``clock`` table, or the
instant a test stopped it at (``0008_clock_stop.sql``). Production never writes that table,
so its time is PostgreSQL's; a test moves it, or stops it and moves it. While the table is
empty the function is ``SELECT now()``, which PostgreSQL inlines; a write to the table
replaces it with one that reads the table, and emptying the table puts ``now()`` back
(``0011_clock_free_until_moved.sql``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from .queries import query


def now(conn: psycopg.Connection[Any], schema: str) -> datetime:
    """``schema``'s time: the instant its deadlines, delays and expiries are compared with."""
    row = conn.execute(query("clock_now", schema)).fetchone()
    assert row is not None
    when: datetime = row[0]
    return when


def move_to(conn: psycopg.Connection[Any], schema: str, at: datetime) -> None:
    """Make ``schema``'s time read ``at`` now (and run on from there with PostgreSQL's unless stopped)."""
    conn.execute(query("move_clock", schema), {"at": at})


def advance(conn: psycopg.Connection[Any], schema: str, by: timedelta) -> None:
    """Move ``schema``'s time forward by ``by``."""
    conn.execute(query("advance_clock", schema), {"by": by})


def stop(conn: psycopg.Connection[Any], schema: str, at: datetime) -> None:
    """Stop ``schema``'s time at ``at``: it reads ``at`` until moved (``advance``, ``move_to``)."""
    conn.execute(query("stop_clock", schema), {"at": at})


def reset(conn: psycopg.Connection[Any], schema: str) -> None:
    """Give ``schema`` PostgreSQL's own time back."""
    conn.execute(query("reset_clock", schema))
