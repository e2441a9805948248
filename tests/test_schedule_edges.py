"""Schedules at their edges: a resume that was not needed, an operator's checkout that differs from the
deployed declaration, a schedule removed for a while, the repeated hour of a fall-back night, and a
worker SIGKILLed while it fires a tick.

Like ``test_schedules.py``, each test drives the ticker app on the virtual clock and counts
the rows its step wrote into ``ticker.ticks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from estafeta import Runtime, Schedule, Scheduler
from estafeta._schedule_spec import Cron
from estafeta.testing import AppUnderTest
from sql import schedule_store

from .ticker import app


@pytest.fixture
def ticker(runtime: Runtime) -> Iterator[AppUnderTest]:
    bound = AppUnderTest(app, runtime)
    yield bound
    bound.close()


def firing(bound: AppUnderTest, *schedules: Schedule) -> Scheduler:
    """Make the app's virtual clock fire ``schedules`` only; the scheduler that does."""
    bound.scheduler = bound.clock.scheduler = Scheduler(bound.runtime, list(schedules))
    return bound.scheduler


def ticks(conn: psycopg.Connection[Any], schedule: str) -> list[str]:
    """The ticks the step recorded for ``schedule`` (``HH:MM`` UTC), oldest first."""
    rows = conn.execute("SELECT tick FROM ticker.ticks WHERE schedule = %s ORDER BY tick", (schedule,))
    return [f"{tick.astimezone(UTC):%H:%M}" for (tick,) in rows]


def row(conn: psycopg.Connection[Any], name: str) -> schedule_store.ScheduleRow:
    return next(r for r in schedule_store.list_all(conn, "ticker") if r.name == name)


@pytest.mark.parametrize(
    ("zone", "expression", "at", "latest"),
    [
        # 2026-10-25 in Madrid: 03:00 CEST becomes 02:00 CET. At the second 02:00 (CET, 01:00 UTC)
        # a fixed 02:30 has fired once, at the first 02:30 (00:30 UTC), that night.
        ("Europe/Madrid", "30 2 * * *", "2026-10-25T01:00:00+00:00", "2026-10-25T00:30:00+00:00"),
        ("Europe/Madrid", "30 2 * * *", "2026-10-25T01:45:00+00:00", "2026-10-25T00:30:00+00:00"),
        ("Europe/Madrid", "0 2 * * *", "2026-10-25T01:00:00+00:00", "2026-10-25T00:00:00+00:00"),
        ("Europe/Madrid", "10,40 1,2 * * *", "2026-10-25T01:05:00+00:00", "2026-10-25T00:40:00+00:00"),
        ("Europe/Madrid", "*/20 2 * * *", "2026-10-25T01:15:00+00:00", "2026-10-25T01:00:00+00:00"),
        # 2026-04-05 on Lord Howe Island: 02:00 (+11) becomes 01:30 (+10:30); 01:30-02:00 happens twice.
        ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T15:00:00+00:00", "2026-04-04T14:45:00+00:00"),
        ("Australia/Lord_Howe", "10,40 1,2 * * *", "2026-04-04T15:05:00+00:00", "2026-04-04T14:40:00+00:00"),
    ],
)
def test_latest_through_in_the_repeated_hour_of_a_fall_back_night(
    zone: str, expression: str, at: str, latest: str
) -> None:
    cron, when = Cron(expression, zone), datetime.fromisoformat(at)
    assert cron.latest_through(when) == datetime.fromisoformat(latest)
    # The same tick the scheduler steps through from the day before.
    tick, found = cron.next_after(when - timedelta(days=1)), None
    while tick <= when:
        tick, found = cron.next_after(tick), tick
    assert found == datetime.fromisoformat(latest)
