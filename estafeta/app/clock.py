"""The one clock every time-based decision reads: PostgreSQL's, unless a test moved it.

Saga deadlines and step timeouts, the watchdog's overdue query, delayed outbox rows
(``available_at``), the relay's publish backoff, idempotency-key expiry and retention are
all decided in SQL against each service schema's ``clock_now()``: ``now()`` plus a skew
that only a test writes (``sql/migrations/_common/0007_clock.sql``), or the instant a test
stopped it at (``0008_clock_stop.sql``). So production takes
its time from PostgreSQL with no extra round trip, no decision compares Python's clock
with a database timestamp, and a test moves the time of every process that reads the
database at once (workers, relays and watchdogs in other processes included).

Only a transaction that asks for the test clock may move it (``0012_clock_test_only.sql``):
:class:`Clock` asks. A clock found moved all the same is said at each process's start
(:func:`warn_if_moved`) and in the ``estafeta_clock_moved`` gauge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from estafeta_sql import clock as schema_clock

if TYPE_CHECKING:
    from estafeta.app.runtime import Runtime

logger = logging.getLogger(__name__)


class Clock:
    """The time of ``services``' schemas (each reached through ``runtime``), read and moved together."""

    def __init__(self, runtime: Runtime, services: Iterable[str]) -> None:
        self.runtime = runtime
        self.services = list(services)
        if not self.services:
            raise ValueError("a clock needs at least one service schema to read")

    def now(self) -> datetime:
        """The instant deadlines, delays and expiries are compared with (the first service's)."""
        with self.runtime.database(self.services[0]).connection() as conn:
            return schema_clock.now(conn, self.services[0])

    def set(self, when: datetime) -> None:
        """Make every service's time read ``when`` (timezone-aware) now; it runs on from there unless stopped."""
        if when.tzinfo is None:
            raise ValueError(f"clock.set({when!r}): give a timezone-aware datetime (e.g. tzinfo=UTC)")
        for service in self.services:
            with self.runtime.database(service).transaction() as conn:
                schema_clock.move_to(conn, service, when)

    def advance(self, by: timedelta) -> datetime:
        """Move every service's time forward by ``by``; return the new time."""
        if by < timedelta(0):
            raise ValueError(f"clock.advance({by!r}): time only moves forward; use clock.set() to go back")
        for service in self.services:
            with self.runtime.database(service).transaction() as conn:
                schema_clock.advance(conn, service, by)
        return self.now()

    def stop(self, at: datetime | None = None) -> datetime:
        """Stop every service's time at ``at`` (default: the time now): it moves only when moved.

        ``set`` and ``advance`` keep a stopped clock stopped; ``reset`` starts it again on
        PostgreSQL's time. Return the instant it stopped at.
        """
        if at is not None and at.tzinfo is None:
            raise ValueError(f"clock.stop({at!r}): give a timezone-aware datetime (e.g. tzinfo=UTC)")
        when = self.now() if at is None else at
        for service in self.services:
            with self.runtime.database(service).transaction() as conn:
                schema_clock.stop(conn, service, when)
        return when

    def reset(self) -> None:
        """Give every service PostgreSQL's own time back."""
        for service in self.services:
            with self.runtime.database(service).transaction() as conn:
                schema_clock.reset(conn, service)


def warn_if_moved(runtime: Runtime, services: Iterable[str], process: str) -> list[str]:
    """Log a warning for each of ``services`` whose clock is moved; return their names.

    Every estafeta process calls it as it starts (``process`` says which: ``worker``,
    ``relay``...): production never moves a clock, so a moved one is a test's clock left in
    the database, or a write that should not have happened, and this process's decisions
    will read its time. A service whose database cannot be read is skipped, with a line saying so.
    """
    found = []
    for service in services:
        try:
            with runtime.database(service).connection() as conn:
                moved = schema_clock.moved(conn, service)
        except Exception as exc:  # the process reports its own outage; this check only notes it
            logger.info("estafeta %s: could not read the clock of %s: %s", process, service, exc)
            continue
        if moved is not None:
            found.append(service)
            logger.warning(
                "estafeta %s: the clock of schema %s is moved (%s): this process's deadlines, delays,"
                " backoffs, expiries and retention in %s read that time, not PostgreSQL's. Production"
                " never moves it: unless this database is a test's, run `DELETE FROM %s.clock`"
                " (runbook: EstafetaClockMoved)",
                process,
                service,
                moved.describe(),
                service,
                service,
            )
    return found
