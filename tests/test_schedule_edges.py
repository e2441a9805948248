"""Schedules at their edges: a resume that was not needed, an operator's checkout that differs from the
deployed declaration, a schedule removed for a while, the repeated hour of a fall-back night, and a
worker SIGKILLed while it fires a tick.

Like ``test_schedules.py``, each test drives the ticker app on the virtual clock and counts
the rows its step wrote into ``ticker.ticks``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from estafeta import CatchUp, Overlap, Runtime, Schedule, Scheduler
from estafeta.schedules.spec import Cron, Every
from estafeta.testing import AppUnderTest
from estafeta_sql import schedule_store

from .helpers import wait_until
from .integration.processes import ROOT, service_env
from .test_cli import run
from .ticker import SERVICE, Tick, app
from .ticker_firer import interrupted


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


def test_resuming_a_schedule_that_is_not_paused_leaves_its_due_tick_to_fire(ticker: AppUnderTest, conn) -> None:
    schedule = app.schedule("broken")  # every minute
    firing(ticker, schedule)
    ticker.clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    ticker.clock.clock.advance(timedelta(minutes=1))  # 12:01 due, not fired yet
    assert ticker.scheduler.set_paused(schedule, paused=False) is False  # nothing to resume
    state = row(conn, "broken")
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 1, tzinfo=UTC) and state.last_outcome is None
    assert ticker.clock.run_due().schedules == Counter(fired=1)
    ticker.run_until_idle()
    assert ticks(conn, "broken") == ["12:01"]


def test_an_operator_s_checkout_declaring_a_schedule_otherwise_is_refused(database_url: str, runtime, conn) -> None:
    scheduler = Scheduler(runtime, [app.schedule("slow")])
    scheduler.register()
    conn.execute("UPDATE ticker.schedules SET spec = 'every 0:07:00' WHERE name = 'slow'")  # as deployed
    env = {**service_env(database_url, "stub://"), "ESTAFETA_APP": "tests.ticker"}
    for command in ("pause", "resume", "trigger"):
        refused = run(env, "schedules", command, "slow")
        assert refused.returncode == 2, refused
        assert refused.stderr.strip().splitlines() == [
            f"estafeta schedules {command}: Invalid value for NAME: schedule ticker.slow runs as 'every 0:07:00'"
            " but this checkout declares 'every 0:05:00': run the command from the deployed code"
        ]
    state = row(conn, "slow")
    assert (state.spec, state.paused, state.fired, state.last_outcome) == ("every 0:07:00", False, 0, None)
    assert conn.execute("SELECT count(*) FROM ticker.outbox").fetchone() == (0,)


def _gone_for_a_while(tick: datetime) -> Tick:
    return Tick("gone_for_a_while", tick)


GONE = Schedule(
    SERVICE,
    "gone_for_a_while",
    Every(timedelta(minutes=1)),
    _gone_for_a_while,
    overlap=Overlap.ALLOW,
    catch_up=CatchUp.ALL,
    grace=timedelta(minutes=1),
)


@pytest.mark.parametrize(("absence", "caught_up"), [(timedelta(days=1), 0), (timedelta(minutes=3), 3)])
def test_a_schedule_removed_for_long_starts_again_after_now_as_after_a_pause(
    ticker: AppUnderTest, conn, absence: timedelta, caught_up: int
) -> None:
    with_it = firing(ticker, GONE)
    ticker.clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    assert ticker.clock.advance(timedelta(minutes=3)).schedules == Counter(fired=3)  # 12:01 to 12:03
    # A deploy without it: its workers register the service's schedules, and it is not one of them.
    Scheduler(ticker.runtime, [app.schedule("broken")]).register()
    ticker.clock.clock.advance(absence)
    # Declared again: a long absence is a pause (its ticks are neither fired nor missed), a short one a downtime.
    with_it.register()
    passes = ticker.clock.run_due()
    assert passes.schedules == (Counter(fired=caught_up) if caught_up else Counter())
    state = row(conn, "gone_for_a_while")
    assert (state.fired, state.missed) == (3 + caught_up, 0)
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 4, tzinfo=UTC) + absence


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


def test_a_tick_whose_worker_was_killed_while_firing_it_fires_on_the_next_pass_under_catch_up_last(
    ticker: AppUnderTest, database_url: str, conn
) -> None:
    schedule = interrupted(lambda tick: Tick("interrupted", tick))
    firing(ticker, schedule)
    ticker.clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    ticker.clock.clock.set(datetime(2026, 6, 1, 12, 1, 10, tzinfo=UTC))  # 12:01 due
    # Another worker fires 12:01 and hangs in the firing transaction...
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.ticker_firer"],
        cwd=ROOT,
        env=service_env(database_url, "stub://"),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith("firing 2026-06-01T12:01:00")
        # ...until after 12:03, when it is SIGKILLed.
        ticker.clock.clock.set(datetime(2026, 6, 1, 12, 3, 10, tzinfo=UTC))
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
    found: Counter[str] = Counter()

    def fired() -> bool:
        found.update(ticker.clock.run_due().schedules)  # the dead worker's lock goes with its session
        return bool(found)

    wait_until(fired, timeout=30, what="a pass firing the schedule")
    # The killed worker's 12:01 fires, as the latest (12:03) does; 12:02 is missed by the policy.
    assert found == Counter(fired=2, missed=1)
    ticker.run_until_idle()
    assert ticks(conn, "interrupted") == ["12:01", "12:03"]
    state = row(conn, "interrupted")
    assert (state.fired, state.missed, state.next_fire_at) == (2, 1, datetime(2026, 6, 1, 12, 4, tzinfo=UTC))
