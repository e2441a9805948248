"""Schedules fired by four real worker processes and a relay, SIGKILLed at random across tick boundaries.

The ticker app's three one-second schedules (catch-up ``all``, ``last`` and ``none``) run
in four ``dramatiq tests.ticker_worker`` processes with a real relay on RabbitMQ. For
``SCHEDULE_KILL_SECONDS`` (25 s by default; two minutes with 120),
a random worker or the relay is SIGKILLed and restarted every 0.3-2 s, and twice every
worker is killed at once and left down for three to four seconds. Then the schedules are
paused, the last messages drained, and the effect counted: one row per tick in
``ticker.ticks``, each run once, as many as the firings the schedule's row counts; every
tick between the first and the next accounted for as fired or missed, none twice; under
``all`` none missed, the downtimes' ticks fired late.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from estafeta import Runtime, Scheduler
from estafeta_sql import schedule_store

from ..ticker import app
from .processes import Process, relay, service_env, workers

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

SCHEDULES = ("every_all", "every_last", "every_none")
SECOND = timedelta(seconds=1)


def test_each_tick_fires_exactly_once_while_workers_and_relay_are_killed(
    amqp_url: str, database_url: str, runtime: Runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    duration = float(os.environ.get("SCHEDULE_KILL_SECONDS", "25"))
    seed = int(os.environ.get("SCHEDULE_KILL_SEED") or random.randrange(2**32))
    print(f"seed {seed}, {duration:.0f} s")
    chaos = random.Random(seed)
    env = {**service_env(database_url, amqp_url), "ESTAFETA_APP": "tests.ticker"}

    def worker() -> Process:
        return workers(env, tmp_path, processes=1, threads=2, module="tests.ticker_worker")

    pool = [worker() for _ in range(4)]
    relays = [relay(env, tmp_path)]
    kills = {"worker": 0, "relay": 0, "downtime": 0}
    downtimes = sorted(chaos.uniform(0.25, 0.75) * duration for _ in range(2))
    started = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < duration:
            time.sleep(chaos.uniform(0.3, 2.0))
            if downtimes and elapsed >= downtimes[0]:
                downtimes.pop(0)
                for proc in pool:
                    proc.kill(signal.SIGKILL)
                # Several ticks fall with no process to fire them. The first falls up to a second
                # after the kill and fires once the restarted workers boot: over 4 s of downtime
                # keep it more than 3 s late however fast they boot (3 s was not, on a quick machine).
                time.sleep(chaos.uniform(4.0, 5.0))
                pool = [worker() for _ in pool]
                kills["downtime"] += 1
            elif chaos.random() < 0.25:
                relays[-1].kill(signal.SIGKILL)
                relays.append(relay(env, tmp_path))
                kills["relay"] += 1
            else:
                victim = chaos.randrange(len(pool))
                pool[victim].kill(signal.SIGKILL)
                pool[victim] = worker()
                kills["worker"] += 1
        print(kills)
        # A downtime late in the run (or two drawn close together: one long downtime) may end
        # as the run does: the restarted workers must fire its ticks before the pause.
        _wait_until_caught_up(conn, timeout=60)
        schedules = [app.schedule(name) for name in SCHEDULES]
        scheduler = Scheduler(runtime, schedules)
        for schedule in schedules:
            scheduler.set_paused(schedule, paused=True)
        _wait_until_processed(conn, timeout=90)
    except BaseException:
        for proc in [*pool, *relays]:
            print(f"--- {proc.name} output ---\n{proc.output()[-3000:]}")
        raise
    finally:
        for proc in [*pool, *relays]:
            proc.stop()

    assert kills["downtime"] == 2 and kills["worker"] + kills["relay"] >= duration / 4
    for name in SCHEDULES:
        _assert_each_tick_once(conn, name, app.schedule(name))


def _states(conn: psycopg.Connection[Any]) -> dict[str, schedule_store.ScheduleRow]:
    return {r.name: r for r in schedule_store.list_all(conn, "ticker") if r.name in SCHEDULES}


def _wait_until_caught_up(conn: psycopg.Connection[Any], timeout: float) -> None:
    """Until every schedule's next tick is in the future: the workers are up and fired what fell due."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        states = _states(conn)
        behind = {name: s.next_fire_at for name, s in states.items() if s.next_fire_at <= now}
        if len(states) == len(SCHEDULES) and not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the schedules did not catch up in {timeout} s: next ticks {behind} at {now}")
        time.sleep(0.2)


def _wait_until_processed(conn: psycopg.Connection[Any], timeout: float) -> None:
    """Until every firing counted on the schedules' rows has its effect and the outbox is empty."""
    deadline = time.monotonic() + timeout
    while True:
        states = _states(conn)
        done = dict(conn.execute("SELECT schedule, count(*) FROM ticker.ticks GROUP BY schedule").fetchall())
        waiting = conn.execute("SELECT count(*) FROM ticker.outbox").fetchone()
        if waiting == (0,) and all(done.get(name, 0) == states[name].fired for name in SCHEDULES):
            return
        if time.monotonic() > deadline:
            fired = {name: s.fired for name, s in states.items()}
            raise AssertionError(f"not processed in {timeout} s: fired {fired}, recorded {done}, outbox {waiting}")
        time.sleep(0.5)


def _assert_each_tick_once(conn: psycopg.Connection[Any], name: str, schedule: Any) -> None:
    state = _states(conn)[name]
    rows = conn.execute(
        "SELECT tick, runs, recorded_at FROM ticker.ticks WHERE schedule = %s ORDER BY tick", (name,)
    ).fetchall()
    fired = [tick.astimezone(UTC) for tick, _, _ in rows]
    first: datetime = schedule.timing.next_after(state.created_at)
    ticks = (state.next_fire_at - first) // SECOND
    print(f"{name}: {ticks} ticks, fired {state.fired}, missed {state.missed}, skipped {state.skipped}")
    assert all(runs == 1 for _, runs, _ in rows), f"{name}: a tick's step ran twice"
    assert len(rows) == state.fired, f"{name}: {state.fired} firings, {len(rows)} effects"
    assert all(first <= t < state.next_fire_at and t.microsecond == 0 for t in fired)
    assert state.fired + state.missed + state.skipped == ticks, f"{name}: a tick fired twice or lost"
    if name == "every_all":
        assert state.missed == 0 and fired == [first + n * SECOND for n in range(ticks)]  # none lost
        # The first tick of each downtime (three seconds or more) fires only after the restart.
        late = [t for t, _, recorded in rows if recorded - t > timedelta(seconds=3)]
        assert len(late) >= 2, "the downtimes' ticks were fired late, after the restart"
    else:
        # Two downtimes of 3-4 s: under `none` every tick in them is missed (2 or more each);
        # under `last` the latest fires after the restart, so 1 or more each (3 was seen on
        # a loaded machine, where a restart's first pass came before the next tick).
        least = 4 if name == "every_none" else 2
        assert state.missed >= least, f"{name}: the downtimes' ticks were missed by the catch-up policy"
