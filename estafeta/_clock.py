"""The one clock every time-based decision reads: PostgreSQL's, unless a test moved it.

Saga deadlines and step timeouts, the watchdog's overdue query, delayed outbox rows
(``available_at``), the relay's publish backoff, idempotency-key expiry and retention are
all decided in SQL against each service schema's ``clock_now()``: ``now()`` plus a skew
that only a test writes (``sql/migrations/_common/0007_clock.sql``), or the instant a test
stopped it at (``0008_clock_stop.sql``). So production takes
its time from PostgreSQL with no extra round trip, no decision compares Python's clock
with a database timestamp, and a test moves the time of every process that reads the
database at once (workers, relays and watchdogs in other processes included).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sql import clock as schema_clock

if TYPE_CHECKING:
    from ._runtime import Runtime


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
