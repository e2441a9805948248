"""One clock: every time-based decision in SQL reads the schema's clock_now(), which a test moves."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.errors
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import Clock, Runtime, running
from estafeta.app.clock import warn_if_moved
from estafeta_actors import pingpong
from estafeta_brokers.metrics import ClockCollector
from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.relay import Relay
from estafeta_sql import clock as sql_clock
from estafeta_sql import idempotency, inbox, queries
from estafeta_sql import outbox as store

from .app import app as tests_app
from .conftest import make_relay
from .helpers import scalar, wait_until
from .relay_support import QUEUE, SCHEMA, add, arrivals, check_order, drain_stub


@pytest.fixture
def clock(runtime: Runtime) -> Clock:
    return Clock(runtime, [SCHEMA])


@pytest.fixture
def queue(stub_broker) -> str:
    stub_broker.declare_queue(QUEUE)
    return QUEUE


@pytest.mark.parametrize("filename", ["queries.sql", "sagas.sql", "idempotency.sql"])
def test_no_named_query_reads_postgresql_s_clock_directly(filename: str) -> None:
    # now() only inside clock_now() and in the query that moves it; clock_timestamp() only
    # for the ages reported to operators (metrics), never for a decision.
    for name, code in queries.parse(filename).items():
        if name != "move_clock":
            assert re.findall(r"(?<![a-z_])now\(\)", code) == [], name
        assert all("extract(epoch" in line for line in code.splitlines() if "clock_timestamp" in line), name


def test_an_unmoved_clock_is_postgresql_s(conn, clock: Clock) -> None:
    assert scalar(conn, "SELECT pingpong.clock_now() = now()") is True
    assert scalar(conn, "SELECT count(*) FROM pingpong.clock") == 0
    before = datetime.now(UTC)
    assert abs(clock.now() - before) < timedelta(minutes=1)


def clock_plan(conn: psycopg.Connection[Any]) -> str:
    """What PostgreSQL runs for ``pingpong.clock_now()``."""
    rows = conn.execute("EXPLAIN (VERBOSE, COSTS OFF) SELECT pingpong.clock_now()").fetchall()
    return "\n".join(row[0] for row in rows)


def test_an_unmoved_clock_is_inlined_as_now_and_a_moved_one_reads_its_table(conn, clock: Clock) -> None:
    # Production's clock is never moved: PostgreSQL runs now(), no function, no query.
    assert "Output: now()" in clock_plan(conn)
    clock.advance(timedelta(hours=1))
    assert "Output: pingpong.clock_now()" in clock_plan(conn)
    assert scalar(conn, "SELECT pingpong.clock_now() - now()") == timedelta(hours=1)
    clock.reset()
    assert "Output: now()" in clock_plan(conn)
    clock.stop(datetime(2030, 1, 1, tzinfo=UTC))
    conn.execute("TRUNCATE pingpong.clock")  # a test's wipe empties it too
    assert "Output: now()" in clock_plan(conn)
    assert scalar(conn, "SELECT pingpong.clock_now() = now()") is True


def test_a_statement_prepared_before_the_clock_moves_reads_the_moved_clock(database_url: str, clock: Clock) -> None:
    with psycopg.connect(database_url, autocommit=True) as worker:
        statement = "SELECT pingpong.clock_now(), now()"
        for _ in range(8):  # prepared, then past the server's five custom plans: now() inlined in a generic plan
            moved, now = worker.execute(statement, prepare=True).fetchone()  # type: ignore[misc]
            assert moved == now
        assert scalar(worker, "SELECT generic_plans FROM pg_prepared_statements WHERE statement = %s", statement) > 0
        at = datetime(2030, 1, 1, tzinfo=UTC)
        clock.stop(at)
        assert worker.execute(statement, prepare=True).fetchone()[0] == at  # type: ignore[index]
        clock.reset()
        moved, now = worker.execute(statement, prepare=True).fetchone()  # type: ignore[misc]
        assert moved == now


@pytest.fixture
def table_writer(conn) -> Iterator[str]:
    """A role that may only use the schema and read and write its clock table (the usual DML grant)."""
    role = f"clock_writer_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role}")
    try:
        conn.execute(f"GRANT USAGE ON SCHEMA pingpong TO {role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON pingpong.clock TO {role}")
        yield role
    finally:
        conn.execute("DELETE FROM pingpong.clock")
        conn.execute(f"REVOKE ALL ON pingpong.clock FROM {role}")
        conn.execute(f"REVOKE ALL ON SCHEMA pingpong FROM {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize(
    "write",
    [
        "INSERT INTO pingpong.clock (skew) VALUES ('8 days')",
        "INSERT INTO pingpong.clock (stopped_at) VALUES (now())",
        "INSERT INTO pingpong.clock (skew) VALUES ('0') ON CONFLICT (only_row) DO UPDATE SET skew = '8 days'",
    ],
)
def test_a_role_with_only_table_grants_cannot_move_the_clock(conn, table_writer: str, clock: Clock, write: str) -> None:
    # Production's time is not a table any role with the usual DML grant can write.
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"pingpong\.clock is a test's clock"):
            conn.execute(write)
    assert scalar(conn, "SELECT count(*) FROM pingpong.clock") == 0
    assert scalar(conn, "SELECT pingpong.clock_now() = now()") is True
    assert "Output: now()" in clock_plan(conn)
    # A row a test left there cannot be changed either; emptying it (PostgreSQL's time back) can.
    clock.advance(timedelta(hours=1))
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE pingpong.clock SET skew = '8 days'")
    assert scalar(conn, "SELECT pingpong.clock_now() - now()") == timedelta(hours=1)
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        conn.execute("DELETE FROM pingpong.clock")
    assert "Output: now()" in clock_plan(conn)


def test_the_test_clock_moves_the_time_for_a_role_that_may_only_write_the_clock_table(conn, table_writer: str) -> None:
    # The table's trigger replaces clock_now() as its owner, not as the role writing the table:
    # a test's role that is not the schema's owner moves the clock by asking for it.
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        sql_clock.advance(conn, SCHEMA, timedelta(hours=1))
    assert "Output: pingpong.clock_now()" in clock_plan(conn)
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        sql_clock.reset(conn, SCHEMA)
    assert "Output: now()" in clock_plan(conn)
    # Asking lasts for the transaction that asked: the pooled connection's next one has not.
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {table_writer}")
        sql_clock.stop(conn, SCHEMA, datetime(2030, 1, 1, tzinfo=UTC))
    with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("UPDATE pingpong.clock SET skew = '8 days'")


def gauge(collector: ClockCollector) -> dict[str, float]:
    (family,) = collector.collect()
    return {sample.labels["service"]: sample.value for sample in family.samples}


def test_a_moved_clock_shows_in_its_gauge_and_in_a_warning_at_a_process_start(
    runtime: Runtime, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    collector = ClockCollector([Outbox(SCHEMA, runtime.database(SCHEMA))])
    assert gauge(collector) == {SCHEMA: 0}
    with caplog.at_level(logging.WARNING):
        assert warn_if_moved(runtime, [SCHEMA], "relay") == []
    assert not caplog.records
    clock.advance(timedelta(days=8))
    assert gauge(collector) == {SCHEMA: 1}
    with caplog.at_level(logging.WARNING):
        assert warn_if_moved(runtime, [SCHEMA], "relay") == [SCHEMA]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "estafeta relay: the clock of schema pingpong is moved (ahead of PostgreSQL's time by 8 days" in (
        record.getMessage()
    )
    assert "DELETE FROM pingpong.clock" in record.getMessage()
    clock.stop(datetime(2030, 1, 1, tzinfo=UTC))
    assert gauge(collector) == {SCHEMA: 1}
    clock.reset()
    assert gauge(collector) == {SCHEMA: 0}


def test_set_and_advance_move_the_schema_s_time(conn, clock: Clock) -> None:
    clock.set(datetime(2030, 1, 1, tzinfo=UTC))
    assert datetime(2030, 1, 1, tzinfo=UTC) <= clock.now() < datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    moved = clock.advance(timedelta(days=2))
    assert moved >= datetime(2030, 1, 3, tzinfo=UTC)
    clock.reset()
    assert scalar(conn, "SELECT pingpong.clock_now() = now()") is True
    clock.advance(timedelta(hours=1))
    clock.advance(timedelta(minutes=30))
    assert scalar(conn, "SELECT skew FROM pingpong.clock") == timedelta(hours=1, minutes=30)  # exactly
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.set(datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(timedelta(seconds=-1))


def test_a_stopped_clock_reads_one_instant_until_moved_and_stays_stopped(conn, clock: Clock) -> None:
    at = datetime(2030, 3, 29, 12, 0, tzinfo=UTC)
    assert clock.stop(at) == at
    conn.execute("SELECT pg_sleep(0.05)")
    assert clock.now() == at  # a running clock would be 50 ms on
    assert clock.advance(timedelta(seconds=1)) == at + timedelta(seconds=1)  # exactly
    clock.set(datetime(2031, 1, 1, tzinfo=UTC))
    conn.execute("SELECT pg_sleep(0.05)")
    assert clock.now() == datetime(2031, 1, 1, tzinfo=UTC)
    assert scalar(conn, "SELECT pingpong.clock_now()") == datetime(2031, 1, 1, tzinfo=UTC)
    stopped_now = clock.stop()  # at the time it reads
    assert stopped_now == datetime(2031, 1, 1, tzinfo=UTC)
    clock.reset()
    assert scalar(conn, "SELECT pingpong.clock_now() = now()") is True
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.stop(datetime(2030, 1, 1))


def test_a_delayed_row_falls_due_when_the_clock_passes_it(conn, relay: Relay, stub_broker, queue, clock: Clock):
    add(conn, "a", 0, delay=timedelta(hours=1))
    assert relay.drain_once() == 0
    assert store.seconds_until_next_due(conn, SCHEMA) == pytest.approx(3600, abs=60)
    clock.advance(timedelta(minutes=59))
    assert relay.drain_once() == 0
    clock.advance(timedelta(minutes=2))
    assert relay.drain_once() == 1
    assert check_order(arrivals(drain_stub(stub_broker)), {"a": [0]}) == 0


def test_a_refused_publish_is_retried_after_its_backoff_on_the_clock(conn, runtime: Runtime, stub_broker, clock: Clock):
    relay = make_relay(runtime, stub_broker, max_attempts=5, attempt_backoff=timedelta(minutes=10))
    add(conn, "a", 0, queue="nowhere")  # refused: the stub broker has no such queue yet
    assert relay.drain_once() == 0
    stub_broker.declare_queue("nowhere")
    assert relay.drain_once() == 0  # still backing off
    clock.advance(timedelta(minutes=11))
    assert relay.drain_once() == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


def test_retention_counts_age_on_the_clock(conn, clock: Clock) -> None:
    inbox.record(conn, SCHEMA, "pingpong.ping", uuid.uuid4())
    assert inbox.prune(conn, SCHEMA, timedelta(days=7)) == 0
    clock.advance(timedelta(days=8))
    inbox.record(conn, SCHEMA, "pingpong.ping", uuid.uuid4())  # recorded at the clock's time: young
    assert inbox.prune(conn, SCHEMA, timedelta(days=7)) == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox") == 1


def test_an_idempotency_record_expires_on_the_clock(conn, runtime: Runtime) -> None:
    clock = Clock(runtime, ["orders"])
    request = {"client": "c", "key": "k", "fingerprint": "f", "method": "POST", "target": "/orders"}
    response = {"status": 201, "headers": [], "body": b"{}"}
    assert idempotency.store(conn, "orders", **request, **response, ttl=timedelta(hours=24))
    assert idempotency.claim(conn, "orders", client="c", key="k", lock_name="c/k")[0] is not None
    assert idempotency.prune(conn, "orders", 100) == 0
    clock.advance(timedelta(hours=25))
    assert idempotency.claim(conn, "orders", client="c", key="k", lock_name="c/k") == (None, True)
    assert idempotency.prune(conn, "orders", 100) == 1


def test_a_running_relay_and_worker_follow_the_clock(runtime: Runtime, conn) -> None:
    """Not only the passes a test runs: every process reading the database sees the moved time."""
    binding = tests_app.bind(StubBroker(), runtime)
    with running(binding, poll_interval=0.1):
        with conn.transaction():
            pingpong.SERVICE.send(
                conn, pingpong.Ping(ping_id := uuid.uuid4(), datetime.now(UTC)), delay=timedelta(days=1)
            )
        Clock(runtime, ["pingpong"]).advance(timedelta(days=1, seconds=1))
        wait_until(
            lambda: scalar(conn, "SELECT pongs FROM pingpong.pings WHERE ping_id = %s", ping_id) == 1,
            what="the delayed ping, answered",
        )
