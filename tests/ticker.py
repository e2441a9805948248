"""The ticker service: recurring schedules whose every tick leaves one row in ``ticker.ticks``.

``dramatiq tests.ticker_worker`` serves it (its workers fire the schedules); the schedule tests
drive it with the virtual clock, and the kill test with real worker processes.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import attrs

from estafeta import App, Service, StepContext

SERVICE = Service("ticker", migrations=Path(__file__).parent / "migrations" / "ticker")


@attrs.frozen
class Tick:
    """One tick of a schedule, to be recorded."""

    schedule: str
    tick: datetime


@attrs.frozen
class SlowTick:
    """A tick handled by a step that can be held back (the overlap tests don't deliver it)."""

    tick: datetime


@SERVICE.step(Tick)
def record_tick(ctx: StepContext, command: Tick) -> None:
    """Count the tick's run: the inbox makes a duplicate delivery a no-op, so ``runs`` stays 1."""
    ctx.conn.execute(
        "INSERT INTO ticker.ticks (schedule, tick) VALUES (%s, %s)"
        " ON CONFLICT (schedule, tick) DO UPDATE SET runs = ticks.runs + 1",
        (command.schedule, command.tick),
    )


@SERVICE.step(SlowTick)
def record_slow_tick(ctx: StepContext, command: SlowTick) -> None:
    """Record the slow schedule's tick."""
    record_tick(ctx, Tick("slow", command.tick))


# A tick every second under each catch-up policy (the kill test counts them); runs may
# overlap, so every tick is fired or counted missed, never skipped.
@SERVICE.schedule(every=timedelta(seconds=1), catch_up="all", overlap="allow")
def every_all(tick: datetime) -> Tick:
    """Every missed tick is fired after a downtime."""
    return Tick("every_all", tick)


@SERVICE.schedule(every=timedelta(seconds=1), catch_up="last", overlap="allow")
def every_last(tick: datetime) -> Tick:
    """Only the latest missed tick is fired after a downtime."""
    return Tick("every_last", tick)


@SERVICE.schedule(every=timedelta(seconds=1), catch_up="none", overlap="allow", grace=timedelta(milliseconds=500))
def every_none(tick: datetime) -> Tick:
    """No tick later than 0.5 s is fired."""
    return Tick("every_none", tick)


# Cron schedules in Madrid across daylight-saving changes (virtual clock only).
@SERVICE.schedule("30 2 * * *", tz="Europe/Madrid", catch_up="all", overlap="allow")
def madrid_0230(tick: datetime) -> Tick:
    """At 02:30 Madrid time each day."""
    return Tick("madrid_0230", tick)


@SERVICE.schedule("*/30 * * * *", tz="Europe/Madrid", catch_up="all", overlap="allow")
def madrid_half_hourly(tick: datetime) -> Tick:
    """Every half hour, Madrid time."""
    return Tick("madrid_half_hourly", tick)


@SERVICE.schedule("0 9 * * 1-5", tz="America/New_York", catch_up="all", overlap="allow")
def new_york_weekdays(tick: datetime) -> Tick:
    """At 09:00 New York time on weekdays."""
    return Tick("new_york_weekdays", tick)


# Skips while its previous run is unprocessed.
@SERVICE.schedule(every=timedelta(minutes=5), catch_up="all", overlap="skip")
def slow(tick: datetime) -> SlowTick:
    """Every five minutes, unless the previous run is not processed yet."""
    return SlowTick(tick)


@SERVICE.schedule(every=timedelta(minutes=1), catch_up="all", overlap="allow")
def broken(tick: datetime) -> Tick:
    """Raises when ``TICKER_BROKEN`` is set: one schedule's failure among healthy ones."""
    if os.environ.get("TICKER_BROKEN"):
        raise RuntimeError("the report server is down")
    return Tick("broken", tick)


app = App("ticker", services=[SERVICE])
