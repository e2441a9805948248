"""Recurring schedules on the virtual clock: ticks, catch-up and overlap policies, time zones and DST, the CLI.

Each test drives the ticker app (``tests/ticker.py``) with the schedules it is about and
counts the effect: the rows its step wrote into ``ticker.ticks``, one per tick.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from estafeta import CatchUp, Overlap, Runtime, Schedule, Scheduler
from estafeta.schedules.spec import Cron, Every, timing_of
from estafeta.testing import AppUnderTest, VirtualClock
from estafeta_sql import schedule_store

from .integration.processes import service_env
from .test_cli import run
from .ticker import SERVICE, Tick, app

MADRID = ZoneInfo("Europe/Madrid")
NEW_YORK = ZoneInfo("America/New_York")


@pytest.fixture
def ticker(runtime: Runtime) -> Iterator[AppUnderTest]:
    bound = AppUnderTest(app, runtime)
    yield bound
    bound.close()


def only(bound: AppUnderTest, *names: str) -> VirtualClock:
    """The app's virtual clock, firing only the schedules ``names``."""
    bound.scheduler = Scheduler(bound.runtime, [app.schedule(name) for name in names])
    bound.clock.scheduler = bound.scheduler
    return bound.clock


def ticks(conn: psycopg.Connection[Any], schedule: str) -> list[tuple[datetime, int]]:
    """The ticks the step recorded for ``schedule``, oldest first, with how many times each ran."""
    rows = conn.execute("SELECT tick, runs FROM ticker.ticks WHERE schedule = %s ORDER BY tick", (schedule,))
    return [(tick.astimezone(UTC), runs) for tick, runs in rows]


def row(conn: psycopg.Connection[Any], name: str) -> schedule_store.ScheduleRow:
    return next(r for r in schedule_store.list_all(conn, "ticker") if r.name == name)


def test_every_second_fires_each_tick_once_at_whole_seconds(ticker: AppUnderTest, conn) -> None:
    clock = only(ticker, "every_all")
    start = datetime(2026, 6, 1, 12, 0, 0, 400_000, tzinfo=UTC)
    clock.set(start)
    # The clock also runs on in real time: set it (0.6 s before the next tick), then pass.
    clock.clock.set(datetime(2026, 6, 1, 12, 0, 10, 400_000, tzinfo=UTC))
    passes = clock.run_due()
    assert passes.schedules == Counter(fired=10) and passes.published == 10
    ticker.run_until_idle()
    expected = [datetime(2026, 6, 1, 12, 0, s, tzinfo=UTC) for s in range(1, 11)]
    assert ticks(conn, "every_all") == [(t, 1) for t in expected]
    state = row(conn, "every_all")
    assert (state.fired, state.missed, state.skipped) == (10, 0, 0)
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 0, 11, tzinfo=UTC)
    assert state.last_tick == expected[-1]
    clock.clock.set(datetime(2026, 6, 1, 12, 0, 10, 500_000, tzinfo=UTC))
    assert clock.run_due().schedules == Counter()  # nothing due before 12:00:11


@pytest.mark.parametrize(
    ("name", "offset_ms", "fired", "missed"),
    [
        ("every_all", 700, 30, 0),  # all 30 ticks of the downtime, late
        ("every_last", 700, 1, 29),  # the latest only
        ("every_none", 200, 1, 29),  # none but the latest, 0.2 s late: within its 0.5 s grace
        ("every_none", 700, 0, 30),  # none: the latest is 0.7 s late
    ],
)
def test_after_a_downtime_the_catch_up_policy_fires_all_the_last_or_none_and_counts_the_rest(
    ticker: AppUnderTest, conn, name: str, offset_ms: int, fired: int, missed: int
) -> None:
    clock = only(ticker, name)
    clock.set(datetime(2026, 6, 1, 12, 0, 0, 100_000, tzinfo=UTC))
    clock.clock.set(datetime(2026, 6, 1, 12, 0, 1, 100_000, tzinfo=UTC))
    assert clock.run_due().schedules == Counter(fired=1)  # 12:00:01, on time
    # Downtime: no pass until 12:00:31 plus offset. The time is stopped there, not left to run
    # on in real time: on a loaded machine the pass can take longer than the 0.3 s the offsets
    # leave to the next tick, which would then be due too.
    clock.clock.stop(datetime(2026, 6, 1, 12, 0, 31, offset_ms * 1000, tzinfo=UTC))
    passes = clock.run_due()
    assert passes.schedules == Counter({k: v for k, v in (("fired", fired), ("missed", missed)) if v})
    ticker.run_until_idle()
    recorded = ticks(conn, name)
    assert len(recorded) == 1 + fired and all(runs == 1 for _, runs in recorded)
    if name == "every_all":
        assert [t for t, _ in recorded] == [datetime(2026, 6, 1, 12, 0, s, tzinfo=UTC) for s in range(1, 32)]
    elif fired:
        assert recorded[-1][0] == datetime(2026, 6, 1, 12, 0, 31, tzinfo=UTC)
    state = row(conn, name)
    # Every tick of [first, next) is accounted for: fired or missed, none twice.
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 0, 32, tzinfo=UTC)
    assert state.fired + state.missed == 31 and state.missed == missed
    if missed:
        assert f"missed {missed} by the catch-up policy" in (state.last_outcome or "")


def test_after_three_hours_down_catch_up_last_fires_the_latest_and_says_at_least_how_many_were_missed(
    ticker: AppUnderTest, conn
) -> None:
    clock = only(ticker, "every_last")
    clock.set(datetime(2026, 6, 1, 12, 0, 0, 200_000, tzinfo=UTC))
    clock.clock.set(datetime(2026, 6, 1, 15, 0, 0, 200_000, tzinfo=UTC))  # 10,800 ticks due
    assert clock.run_due().schedules == Counter(fired=1, missed=10_000)  # counted up to 10,000
    ticker.run_until_idle()
    assert ticks(conn, "every_last") == [(datetime(2026, 6, 1, 15, 0, 0, tzinfo=UTC), 1)]
    state = row(conn, "every_last")
    assert state.last_outcome is not None and "missed 10000+ by the catch-up policy" in state.last_outcome
    assert state.next_fire_at == datetime(2026, 6, 1, 15, 0, 1, tzinfo=UTC)


def test_a_long_catch_up_fires_in_batches_until_nothing_is_due(ticker: AppUnderTest, conn) -> None:
    clock = only(ticker, "every_all")
    start = datetime(2026, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC)
    clock.set(start)
    clock.clock.advance(timedelta(seconds=150))
    fired = clock.run_due().schedules["fired"]
    # 150 ticks (two batches), and those that fell due in real time while they were fired.
    assert 150 <= fired < 160
    ticker.run_until_idle()
    expected = [datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC) + timedelta(seconds=n) for n in range(fired)]
    assert ticks(conn, "every_all") == [(t, 1) for t in expected]
    state = row(conn, "every_all")
    assert state.fired == fired and state.next_fire_at == expected[-1] + timedelta(seconds=1)


def test_concurrent_schedulers_fire_each_tick_exactly_once(ticker: AppUnderTest, conn) -> None:
    # Four schedulers (as in four worker processes) race over 60 due ticks of three schedules.
    clock = only(ticker, "every_all", "every_last", "every_none")
    clock.set(datetime(2026, 6, 1, 12, 0, 0, 200_000, tzinfo=UTC))
    clock.clock.set(datetime(2026, 6, 1, 12, 1, 0, 200_000, tzinfo=UTC))
    schedules = [app.schedule(n) for n in ("every_all", "every_last", "every_none")]
    totals: Counter[str] = Counter()
    mutex = threading.Lock()
    start = threading.Barrier(4)

    def race() -> None:
        scheduler = Scheduler(ticker.runtime, schedules)
        start.wait()
        while found := scheduler.fire_due():
            with mutex:
                totals.update(found)

    threads = [threading.Thread(target=race) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Ticks that fell due in real time meanwhile fire too (on time): count by the rows.
    ticker.run_until_idle()
    counted = [len(ticks(conn, n)) for n in ("every_all", "every_last", "every_none")]
    assert totals["fired"] == sum(counted) and 60 <= counted[0] < 65 and counted[1] >= 1
    states = [row(conn, n) for n in ("every_all", "every_last", "every_none")]
    assert [s.fired for s in states] == counted
    first = datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC)
    for state in states:  # every tick fired or missed, none twice
        assert state.fired + state.missed == (state.next_fire_at - first) // timedelta(seconds=1)
    assert all(runs == 1 for n in ("every_all", "every_last", "every_none") for _, runs in ticks(conn, n))


def test_a_worker_s_scheduler_thread_fires_on_the_real_clock_and_stops_when_told(runtime: Runtime, conn) -> None:
    schedule = app.schedule("every_all")
    scheduler = Scheduler(runtime, [schedule])
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 5
        fired = conn.execute("SELECT fired > 0 FROM ticker.schedules WHERE name = 'every_all'").fetchone()
        while fired != (True,):
            assert time.monotonic() < deadline, "no tick fired within 5 s"
            time.sleep(0.05)
            fired = conn.execute("SELECT fired > 0 FROM ticker.schedules WHERE name = 'every_all'").fetchone()
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    state = row(conn, "every_all")
    tick = state.last_tick
    assert tick is not None and tick.microsecond == 0
    queued = conn.execute("SELECT message_id FROM ticker.outbox WHERE message_id = %s", (state.last_message_id,))
    assert queued.fetchone() == (schedule.tick_message_id(tick),)


def test_a_tick_claimed_by_another_transaction_is_skipped_not_fired_again(ticker: AppUnderTest, runtime) -> None:
    clock = only(ticker, "broken")  # every minute (it raises only with TICKER_BROKEN set)
    clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    clock.clock.set(datetime(2026, 6, 1, 12, 1, 0, 100_000, tzinfo=UTC))  # 12:01 due, 12:02 a minute away
    schedule = app.schedule("broken")
    with runtime.database("ticker").transaction() as holding:
        assert schedule_store.claim_due(holding, "ticker", "broken") is not None  # another process's firing
        assert Scheduler(runtime, [schedule]).fire(schedule) == Counter()  # skipped, not waited for
    assert Scheduler(runtime, [schedule]).fire(schedule) == Counter(fired=1)  # the holder rolled back
    assert Scheduler(runtime, [schedule]).fire(schedule) == Counter()


def _local(recorded: list[tuple[datetime, int]], zone: ZoneInfo) -> list[str]:
    return [f"{t.astimezone(zone):%m-%d %H:%M%z}" for t, _ in recorded]


def _run_through(ticker: AppUnderTest, clock: VirtualClock, start: datetime, hours: int, step: timedelta) -> None:
    clock.set(start)
    for _ in range(int(timedelta(hours=hours) / step)):
        clock.advance(step)
    ticker.run_until_idle()


def test_cron_in_madrid_on_the_night_the_clocks_go_forward(ticker: AppUnderTest, conn) -> None:
    # 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that night.
    clock = only(ticker, "madrid_0230", "madrid_half_hourly")
    _run_through(ticker, clock, datetime(2026, 3, 28, 12, 0, tzinfo=MADRID), 50, timedelta(hours=5))
    # The fixed-time job fires once, at the first instant after the gap (Debian cron's rule).
    assert _local(ticks(conn, "madrid_0230"), MADRID) == ["03-29 03:00+0200", "03-30 02:30+0200"]
    half = _local(ticks(conn, "madrid_half_hourly"), MADRID)
    assert half[half.index("03-29 01:00+0100") :][:4] == [
        "03-29 01:00+0100",
        "03-29 01:30+0100",
        "03-29 03:00+0200",  # 01:30 CET + 30 min
        "03-29 03:30+0200",
    ]
    instants = [t for t, _ in ticks(conn, "madrid_half_hourly")]
    assert {b - a for a, b in itertools.pairwise(instants)} == {timedelta(minutes=30)}


def test_cron_in_madrid_on_the_night_the_clocks_go_back(ticker: AppUnderTest, conn) -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice.
    clock = only(ticker, "madrid_0230", "madrid_half_hourly")
    _run_through(ticker, clock, datetime(2026, 10, 24, 12, 0, tzinfo=MADRID), 40, timedelta(hours=4))
    # A fixed hour fires once, at the first 02:30; a wildcard hour fires at both.
    assert _local(ticks(conn, "madrid_0230"), MADRID) == ["10-25 02:30+0200", "10-26 02:30+0100"]
    half = _local(ticks(conn, "madrid_half_hourly"), MADRID)
    assert half[half.index("10-25 01:30+0200") :][:6] == [
        "10-25 01:30+0200",
        "10-25 02:00+0200",
        "10-25 02:30+0200",
        "10-25 02:00+0100",
        "10-25 02:30+0100",
        "10-25 03:00+0100",
    ]
    instants = [t for t, _ in ticks(conn, "madrid_half_hourly")]
    assert {b - a for a, b in itertools.pairwise(instants)} == {timedelta(minutes=30)}
    assert all(runs == 1 for _, runs in ticks(conn, "madrid_half_hourly"))


def test_catching_up_in_the_repeated_hour_fires_the_latest_tick_not_an_hour_earlier(ticker: AppUnderTest, conn) -> None:
    # 2026-10-25 in Madrid: 02:50 happens twice. At the second 02:50 (CET, 01:50 UTC) the
    # latest half-hour tick is the second 02:30 (01:30 UTC), not the first (00:30 UTC).
    schedule = Schedule(
        SERVICE,
        "madrid_half_hourly_last",
        Cron("*/30 * * * *", "Europe/Madrid"),
        lambda tick: Tick("madrid_half_hourly_last", tick),
        overlap=Overlap.ALLOW,
        catch_up=CatchUp.LAST,
        grace=timedelta(minutes=1),
    )
    ticker.scheduler = ticker.clock.scheduler = Scheduler(ticker.runtime, [schedule])
    ticker.clock.set(datetime(2026, 10, 25, 0, 50, tzinfo=UTC))  # the first 02:50 (CEST)
    ticker.clock.clock.set(datetime(2026, 10, 25, 1, 50, tzinfo=UTC))  # the second, an hour later
    assert ticker.clock.run_due().schedules == Counter(fired=1, missed=1)  # 01:00 UTC missed
    ticker.run_until_idle()
    assert _local(ticks(conn, "madrid_half_hourly_last"), MADRID) == ["10-25 02:30+0100"]
    assert row(conn, "madrid_half_hourly_last").next_fire_at == datetime(2026, 10, 25, 2, 0, tzinfo=UTC)


def test_cron_in_new_york_follows_its_own_dst_and_weekdays(ticker: AppUnderTest, conn) -> None:
    # The US moves its clocks on 2026-03-08 (a Sunday), three weeks before Europe.
    clock = only(ticker, "new_york_weekdays")
    clock.set(datetime(2026, 3, 5, 12, 0, tzinfo=UTC))
    clock.advance(timedelta(days=6))  # one move: the missed ticks are caught up (catch_up="all")
    ticker.run_until_idle()
    assert [f"{t:%a %m-%d %H:%M}Z" for t, _ in ticks(conn, "new_york_weekdays")] == [
        "Thu 03-05 14:00Z",
        "Fri 03-06 14:00Z",
        "Mon 03-09 13:00Z",  # 09:00 EDT
        "Tue 03-10 13:00Z",
    ]  # and not yet Wed 03-11 13:00, a day after Thursday 12:00 + 6 days


def test_overlap_skip_waits_for_the_previous_run_to_be_processed(ticker: AppUnderTest, conn) -> None:
    clock = only(ticker, "slow")
    clock.set(datetime(2026, 6, 1, 12, 1, tzinfo=UTC))
    assert clock.advance(timedelta(minutes=5)).schedules == Counter(fired=1)  # 12:05, published, not processed
    assert clock.advance(timedelta(minutes=5)).schedules == Counter(skipped=1)  # 12:10
    state = row(conn, "slow")
    assert state.last_outcome == "skipped 1: the previous run is unfinished (published, not processed yet)"
    ticker.run_until_idle()  # the 12:05 run is processed
    assert [st.last_run for st in ticker.scheduler.states()] == ["processed"]
    assert clock.advance(timedelta(minutes=5)).schedules == Counter(fired=1)  # 12:15
    # A downtime under catch_up="all": the first missed tick fires, the others find it unfinished.
    clock.clock.advance(timedelta(minutes=20))
    ticker.run_until_idle()
    assert clock.run_due().schedules == Counter(fired=1, skipped=3)
    ticker.run_until_idle()
    assert [f"{t:%H:%M}" for t, _ in ticks(conn, "slow")] == ["12:05", "12:15", "12:20"]
    state = row(conn, "slow")
    assert (state.fired, state.skipped, state.missed) == (3, 4, 0)


def test_a_schedule_that_raises_is_recorded_and_retried_while_the_others_fire(
    ticker: AppUnderTest, conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = only(ticker, "broken", "slow")
    clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    monkeypatch.setenv("TICKER_BROKEN", "1")
    passes = clock.advance(timedelta(minutes=5))  # 12:05:30
    assert passes.schedules == Counter(fired=1, error=1)  # slow's 12:05; broken's 12:01 raised
    broken = row(conn, "broken")
    assert broken.last_outcome == "error: RuntimeError: the report server is down" and broken.fired == 0
    assert broken.next_fire_at == datetime(2026, 6, 1, 12, 1, tzinfo=UTC)  # still due
    monkeypatch.delenv("TICKER_BROKEN")
    assert clock.run_due().schedules == Counter(fired=5)  # 12:01 to 12:05, caught up
    ticker.run_until_idle()
    assert [f"{t:%H:%M}" for t, _ in ticks(conn, "broken")] == ["12:01", "12:02", "12:03", "12:04", "12:05"]


def test_a_changed_declaration_restarts_at_its_first_tick_and_keeps_the_history(ticker: AppUnderTest, conn) -> None:
    clock = only(ticker, "broken")  # every minute
    clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    assert clock.advance(timedelta(minutes=3)).schedules == Counter(fired=3)
    with ticker.runtime.database("ticker").transaction() as tx:
        tx.execute("UPDATE ticker.schedules SET spec = 'every 0:07:00' WHERE name = 'broken'")
    # A process with the other declaration leaves the row alone; this one restarts it on register.
    assert clock.advance(timedelta(minutes=2)).schedules == Counter()
    ticker.scheduler.register()
    state = row(conn, "broken")
    assert state.spec == "every 0:01:00" and state.fired == 3
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 6, tzinfo=UTC)


def test_declarations_are_checked_when_made() -> None:
    assert timing_of(None, timedelta(minutes=5), "UTC") == Every(timedelta(minutes=5))
    assert timing_of("0 9 * * 1-5", None, "Europe/Madrid") == Cron("0 9 * * 1-5", "Europe/Madrid")
    for cron, every, tz, error in [
        ("* * * * *", timedelta(seconds=1), "UTC", "exactly one of them"),
        (None, None, "UTC", "exactly one of them"),
        (None, timedelta(milliseconds=1500), "UTC", "whole number of seconds"),
        ("61 * * * *", None, "UTC", "cron expression '61 * * * *'"),
        ("* * * * *", None, "Mars/Olympus", "not an IANA time zone"),
    ]:
        with pytest.raises(ValueError, match=re.escape(error)):
            timing_of(cron, every, tz)
    with pytest.raises(ValueError, match="already has a schedule named 'every_all'"):
        SERVICE.schedule(every=timedelta(seconds=5), name="every_all")(lambda tick: None)
    with pytest.raises(ValueError, match="overlap='sometimes': say 'skip' or 'allow'"):
        SERVICE.schedule(every=timedelta(seconds=5), name="other", overlap="sometimes")(lambda tick: None)


def test_pause_stops_the_ticks_resume_starts_after_now_and_trigger_fires_once_now(ticker: AppUnderTest, conn) -> None:
    clock = only(ticker, "broken")  # every minute
    schedule = app.schedule("broken")
    clock.set(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    assert clock.advance(timedelta(minutes=2)).schedules == Counter(fired=2)
    ticker.scheduler.set_paused(schedule, paused=True)
    assert clock.advance(timedelta(minutes=5)).schedules == Counter()  # 12:07:30
    message_id = ticker.scheduler.trigger(schedule)  # fires now although paused: the operator asked
    assert clock.run_due().published == 1
    ticker.scheduler.set_paused(schedule, paused=False)
    state = row(conn, "broken")
    assert not state.paused and state.last_message_id == message_id and state.fired == 3
    assert state.next_fire_at == datetime(2026, 6, 1, 12, 8, tzinfo=UTC)  # the paused ticks are not caught up
    assert state.last_outcome == "resumed by an operator"
    assert clock.advance(timedelta(minutes=1)).schedules == Counter(fired=1)
    ticker.run_until_idle()
    assert len(ticks(conn, "broken")) == 4


@pytest.mark.heavy  # eight CLI processes
def test_the_cli_lists_pauses_resumes_and_triggers_and_refuses_an_unknown_name(
    database_url: str, runtime: Runtime, conn
) -> None:
    env = {**service_env(database_url, "stub://"), "ESTAFETA_APP": "tests.ticker"}
    listed = run(env, "schedules", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {s.full_name for s in app.schedules}
    slow = rows["ticker.slow"]
    assert slow["spec"] == "every 0:05:00" and slow["overlap"] == "skip" and slow["catch_up"] == "all"
    # No worker ran: listed, not registered (the list writes nothing).
    assert slow["registered"] is False and slow["next_fire_at"] is None and slow["fired"] == 0
    assert (
        "ticker.slow  every 0:05:00  (overlap skip, catch-up all)  not registered yet"
        in run(env, "schedules", "list").stdout
    )

    assert run(env, "schedules", "pause", "slow").returncode == 0
    paused = {r["name"]: r for r in json.loads(run(env, "schedules", "list", "--json").stdout)}["ticker.slow"]
    assert paused["registered"] and paused["paused"] and paused["next_fire_at"] is None
    triggered = run(env, "schedules", "trigger", "ticker.slow")
    assert triggered.returncode == 0, triggered.stderr
    message_id = uuid.UUID(triggered.stdout.split("message ")[1].strip())
    assert conn.execute("SELECT count(*) FROM ticker.outbox WHERE message_id = %s", (message_id,)).fetchone() == (1,)
    resumed = run(env, "schedules", "resume", "slow")
    assert resumed.returncode == 0 and "resumed; next tick" in resumed.stdout

    text = run(env, "schedules", "list").stdout
    assert "ticker.slow  every 0:05:00  (overlap skip, catch-up all)  next " in text
    assert "last fired" in text and ": waiting to be published; fired 1, skipped 0, missed 0" in text
    assert "last outcome" in text and "resumed by an operator" in text

    for args in (["pause", "nope"],):
        refused = run(env, "schedules", *args)
        assert refused.returncode == 2, refused
        assert refused.stderr.strip().splitlines() == [
            f"estafeta schedules {args[0]}: Invalid value for NAME: no schedule 'nope' in app ticker"
            f" (declared: {', '.join(s.full_name for s in app.schedules)})"
        ]


def test_the_console_shows_each_schedule_s_next_and_last_firing_its_last_run_and_outcome(
    ticker: AppUnderTest, conn
) -> None:
    from fastapi.testclient import TestClient

    from estafeta_console.server.web import WebOptions, create_app

    clock = only(ticker, "slow", "broken")
    clock.set(datetime(2026, 6, 1, 12, 1, tzinfo=UTC))
    clock.advance(timedelta(minutes=5))  # slow fires 12:05, not processed
    clock.advance(timedelta(minutes=5))  # 12:10 skipped
    ticker.scheduler.set_paused(app.schedule("broken"), paused=True)
    with TestClient(create_app(app, ticker.runtime, WebOptions())) as console:
        page = console.get("/console/schedules")
        assert page.status_code == 200
        assert 'href="/console/schedules"' in console.get("/console").text
    html = page.text
    slow = re.search(r'<tr id="schedule-ticker.slow">(.*?)</tr>', html, re.S)
    assert slow is not None
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", slow.group(1), re.S)]
    # Times as <time datetime> (the page's script shows them in the reader's zone), UTC and age in the text.
    assert cells[:4] == ["ticker.slow", "every 0:05:00", "skip", "all"]
    assert cells[4].startswith("2026-06-01 12:15:00 UTC · ") and cells[5].startswith("2026-06-01 12:05:00 UTC · ")
    assert '<time datetime="2026-06-01T12:15:00+00:00"' in slow.group(1)
    assert cells[6:10] == ["published, not processed yet", "1", "1", "0"]
    assert cells[10] == "skipped 1: the previous run is unfinished (published, not processed yet)"
    every = re.search(r'<tr id="schedule-ticker.broken">(.*?)</tr>', html, re.S)
    assert every is not None and "paused" in every.group(1)
    # Declared, never registered: said so rather than hidden.
    never = re.search(r'<tr id="schedule-ticker.madrid_0230">(.*?)</tr>', html, re.S)
    assert never is not None and "not registered yet" in never.group(1)


def test_the_how_to_s_app_and_its_test_do_what_the_page_says(runtime: Runtime) -> None:
    # docs/how-to/schedules.md declares an app and a test of it: both run here, as written.
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "schedules.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, "docs/how-to/schedules.md", "exec"), namespace)
    declared = namespace["app"]
    declared.migrate(runtime)
    bound = AppUnderTest(declared, runtime)
    try:
        namespace["test_after_a_downtime_only_the_last_report_is_sent"](bound, bound.clock)
    finally:
        bound.close()
