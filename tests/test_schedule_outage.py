"""One service's database goes away (behind a TCP proxy) while a scheduler thread fires every service's schedules.

Two services on two databases: ``schednear`` on the run's database, ``schedfar`` on a
database of its own reached through a proxy the test stops and starts. Near's schedules
that do not need far's database keep firing, on the real clock, while it is gone; the
schedule that needs it (its overlap policy asks far's inbox about its previous run) and
far's own schedule are held, with nothing recorded against them, and their ticks are
handled by their catch-up policies once far's database is back. The console's schedules
page shows near's schedules throughout and says far's database is unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from psycopg import sql as pgsql

from estafeta import App, Runtime, Scheduler, Service, Settings, StepContext, build_relay
from estafeta_sql import schedule_store

from .helpers import wait_until
from .tcp_proxy import TcpProxy

NEAR = Service("schednear")
FAR = Service("schedfar")  # in a database of its own, behind the proxy

SECOND = timedelta(seconds=1)


@attrs.frozen
class NearWork:
    tick: datetime


@attrs.frozen
class FarWork:
    tick: datetime


@NEAR.step(NearWork)
def near_work(ctx: StepContext, command: NearWork) -> None:
    return None


@FAR.step(FarWork)
def far_work(ctx: StepContext, command: FarWork) -> None:
    return None


@NEAR.schedule(every=SECOND, catch_up="last", overlap="allow")
def near_local(tick: datetime) -> NearWork:
    """Needs near's database only."""
    return NearWork(tick)


@NEAR.schedule(every=SECOND, catch_up="last", overlap="allow")
def near_to_far(tick: datetime) -> FarWork:
    """Its command goes to far's step, through near's outbox: firing it needs near's database only."""
    return FarWork(tick)


@NEAR.schedule(every=SECOND, catch_up="all", overlap="skip")
def near_to_far_skip(tick: datetime) -> FarWork:
    """Its overlap policy asks far's inbox whether the previous run was processed: it needs far's database."""
    return FarWork(tick)


@FAR.schedule(every=SECOND, catch_up="all", overlap="allow")
def far_local(tick: datetime) -> FarWork:
    """Far's own: its row is in far's database."""
    return FarWork(tick)


APP = App("schedout", services=[NEAR, FAR])


@pytest.fixture
def far_database(database_url: str) -> Iterator[str]:
    """A database of its own for far (on the run's server), dropped afterwards; yields its direct DSN."""
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    name = f"{params['dbname']}_schedfar"
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(database_url, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


@pytest.fixture
def proxy(far_database: str) -> Iterator[TcpProxy]:
    """A proxy to far's database server."""
    params = psycopg.conninfo.conninfo_to_dict(far_database)
    with TcpProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as started:
        yield started


@pytest.fixture
def runtime_far(
    database_url: str, far_database: str, proxy: TcpProxy, conn: psycopg.Connection[Any]
) -> Iterator[Runtime]:
    """A runtime whose far service reaches its database through the proxy; both services migrated and emptied."""
    through_proxy = psycopg.conninfo.make_conninfo(far_database, host="127.0.0.1", port=str(proxy.port))
    runtime = Runtime(Settings(database_url=database_url, service_database_urls={"schedfar": through_proxy}))
    runtime.migrate([NEAR, FAR])
    conn.execute("TRUNCATE schednear.schedules, schednear.outbox")
    yield runtime
    runtime.close()


def rows(dsn: str, service: str) -> dict[str, schedule_store.ScheduleRow]:
    """The service's schedule rows, read on a connection of the test's own (not through the proxy)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r.name: r for r in schedule_store.list_all(conn, service)}


def fired(dsn: str, service: str, name: str) -> int:
    found = rows(dsn, service).get(name)
    return 0 if found is None else found.fired


def caught_up(dsn: str, service: str, name: str) -> bool:
    """Whether ``name``'s next tick is in the future: every tick due so far was handled."""
    found = rows(dsn, service).get(name)
    return found is not None and found.next_fire_at > found.now


def accounted(row: schedule_store.ScheduleRow, first: datetime) -> bool:
    """Whether every tick from ``first`` to the row's next one was fired, skipped or missed, none twice."""
    return row.fired + row.skipped + row.missed == (row.next_fire_at - first) // SECOND


@pytest.mark.heavy  # a minute of real one-second ticks and an outage's pauses
def test_one_database_gone_holds_only_the_schedules_that_need_it(
    runtime_far: Runtime, proxy: TcpProxy, database_url: str, far_database: str
) -> None:
    from fastapi.testclient import TestClient

    from estafeta_console.server.web import WebOptions, create_app

    runtime = runtime_far
    broker = StubBroker()
    APP.bind(broker, runtime)
    # The relay publishes near's outbox as it fills: a run's fate is then in its step's inbox.
    relay = build_relay(runtime, broker, ["schednear"])
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            relay.drain_once()
            stop.wait(0.05)

    scheduler = Scheduler(runtime, APP.schedules)
    threads = [threading.Thread(target=scheduler.run, args=(stop,)), threading.Thread(target=publish)]
    for thread in threads:
        thread.start()
    near, far = database_url, far_database
    try:
        wait_until(
            lambda: (
                all(fired(near, "schednear", n) >= 2 for n in ("near_local", "near_to_far"))
                and fired(far, "schedfar", "far_local") >= 2
            ),
            timeout=60,
            what="every schedule fired",
        )
        proxy.stop()  # far's database is gone
        before = rows(near, "schednear")
        # Near's schedules that need only near's database fire on, one tick after another...
        wait_until(
            lambda: all(fired(near, "schednear", n) >= before[n].fired + 10 for n in ("near_local", "near_to_far")),
            timeout=60,
            what="near's schedules firing while far's database is gone",
        )
        # ...while the one that needs far's inbox is held, with nothing recorded against it.
        held = rows(near, "schednear")["near_to_far_skip"]
        counted = before["near_to_far_skip"].fired + before["near_to_far_skip"].skipped
        assert held.fired + held.skipped + held.missed <= counted + 2, held
        assert not (held.last_outcome or "").startswith("error"), held
        # A worker booting now registers and fires near's schedules; far's wait for their database.
        booting = Scheduler(runtime, APP.schedules)
        booting.register()
        assert not booting.registered and booting.seconds_to_next() is not None
        with TestClient(create_app(APP, runtime, WebOptions())) as console:
            page = console.get("/console/schedules")
        assert page.status_code == 200, page.text
        assert 'id="schedule-schednear.near_local"' in page.text
        assert "unreachable" in page.text

        proxy.start()  # far's database is back: the ticks of the outage go by the catch-up policies
        wait_until(lambda: caught_up(far, "schedfar", "far_local"), timeout=90, what="far's schedule caught up")
        wait_until(lambda: caught_up(near, "schednear", "near_to_far_skip"), timeout=30, what="near_to_far_skip")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    far_row = rows(far, "schedfar")["far_local"]
    # catch_up="all": every tick of the outage fired, late.
    assert far_row.missed == 0 and accounted(far_row, far_local.timing.next_after(far_row.created_at)), far_row
    with psycopg.connect(far, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM schedfar.outbox").fetchone() == (far_row.fired,)
    skip = rows(near, "schednear")["near_to_far_skip"]
    assert accounted(skip, near_to_far_skip.timing.next_after(skip.created_at)), skip
