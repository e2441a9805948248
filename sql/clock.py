"""A service schema's clock: what every time-based decision in its queries reads.

Each service schema carries ``clock_now()`` (``migrations/_common/0007_clock.sql``):
PostgreSQL's ``now()`` plus the skew stored in the schema's one-row ``clock`` table, or the
instant a test stopped it at (``0008_clock_stop.sql``). Production never writes that table,
so its time is PostgreSQL's; a test moves it, or stops it and moves it. While the table is
empty the function is ``SELECT now()``, which PostgreSQL inlines; a write to the table
replaces it with one that reads the table, and emptying the table puts ``now()`` back
(``0011_clock_free_until_moved.sql``).

The table refuses a write that would move the time unless the transaction asked for the
test clock (``estafeta.test_clock = on``, ``0012_clock_test_only.sql``): the functions here
that move it ask, in the caller's transaction, so ``conn`` must be in one.
:func:`moved` tells a process at its start, and the metrics at each scrape, that a clock
was moved.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg

from .queries import query


@attrs.frozen
class MovedClock:
    """A schema's clock table's row: its time is a test's, not PostgreSQL's."""

    #: How far the clock runs ahead of PostgreSQL's ``now()`` (when not stopped).
    skew: timedelta
    #: The instant it reads until moved; ``None``: it runs on with PostgreSQL's time.
    stopped_at: datetime | None

    def describe(self) -> str:
        """How the clock is moved, in a few words (``stopped at ...`` or ``ahead by ...``)."""
        if self.stopped_at is not None:
            return f"stopped at {self.stopped_at.isoformat()}"
        return f"ahead of PostgreSQL's time by {self.skew}"


def moved(conn: psycopg.Connection[Any], schema: str) -> MovedClock | None:
    """``schema``'s clock as a test left it, or ``None`` if its time is PostgreSQL's (always, in production)."""
    row = conn.execute(query("read_clock", schema)).fetchone()
    return None if row is None else MovedClock(skew=row[0], stopped_at=row[1])


def now(conn: psycopg.Connection[Any], schema: str) -> datetime:
    """``schema``'s time: the instant its deadlines, delays and expiries are compared with."""
    row = conn.execute(query("clock_now", schema)).fetchone()
    assert row is not None
    when: datetime = row[0]
    return when


def move_to(conn: psycopg.Connection[Any], schema: str, at: datetime) -> None:
    """Make ``schema``'s time read ``at`` now (and run on from there with PostgreSQL's unless stopped)."""
    with conn.transaction():
        _ask_for_test_clock(conn, schema)
        conn.execute(query("move_clock", schema), {"at": at})


def advance(conn: psycopg.Connection[Any], schema: str, by: timedelta) -> None:
    """Move ``schema``'s time forward by ``by``."""
    with conn.transaction():
        _ask_for_test_clock(conn, schema)
        conn.execute(query("advance_clock", schema), {"by": by})


def stop(conn: psycopg.Connection[Any], schema: str, at: datetime) -> None:
    """Stop ``schema``'s time at ``at``: it reads ``at`` until moved (``advance``, ``move_to``)."""
    with conn.transaction():
        _ask_for_test_clock(conn, schema)
        conn.execute(query("stop_clock", schema), {"at": at})


def reset(conn: psycopg.Connection[Any], schema: str) -> None:
    """Give ``schema`` PostgreSQL's own time back."""
    conn.execute(query("reset_clock", schema))


def _ask_for_test_clock(conn: psycopg.Connection[Any], schema: str) -> None:
    # Transaction-local: the next transaction on this (pooled) connection has not asked. The
    # callers open a transaction (a savepoint inside the caller's) so that the request and the
    # write share one, on an autocommit connection too.
    conn.execute(query("ask_for_test_clock", schema))
