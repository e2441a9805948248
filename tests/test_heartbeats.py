"""Heartbeats: what a process writes while it serves, what a clean stop removes, and what readers flag."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from prometheus_client import CollectorRegistry

from estafeta import Runtime
from estafeta.observability.heartbeats import Heartbeat, Kind, Role, WorkerHeartbeat, worker_roles
from estafeta.observability.liveness import Condition, ServiceSpec, read_liveness
from estafeta.observability.liveness_metrics import LivenessCollector
from estafeta_sql import clock, heartbeats
from estafeta_sql.heartbeats import MISSED_BEATS
from estafeta_sql.queries import parse, query

from .helpers import wait_until
from .test_migrations import _assert_prepares

SERVICE = "probe"
#: A projection name for the readers; the probe service declares none of its own.
PROJECTION = "probe_totals"
SPEC = ServiceSpec(SERVICE, has_queue=True, projections=[PROJECTION])


def _rows(runtime: Runtime) -> list[heartbeats.HeartbeatRow]:
    with runtime.database(SERVICE).connection() as conn:
        return heartbeats.list_rows(conn, SERVICE)


def _write_pending_row(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO probe.outbox (message_id, queue_name, actor_name, message) "
        "VALUES (gen_random_uuid(), 'probe', 'probe.noop', '{}'::jsonb)"
    )


@pytest.mark.parametrize("name", sorted(parse("heartbeats.sql")))
def test_every_heartbeat_query_compiles_against_the_migrated_schema(name: str, schema_conn) -> None:
    _assert_prepares(schema_conn, f"heartbeats_{name}", query(name, SERVICE, "heartbeats.sql"))


@pytest.fixture
def beating(runtime: Runtime) -> Iterator[Heartbeat]:
    roles = [Role(Kind.RELAY, {SERVICE: [SERVICE]}, threads=2), Role(Kind.PROJECTOR, {SERVICE: [PROJECTION]})]
    heartbeat = Heartbeat(roles, runtime.database, interval=60).start()
    yield heartbeat
    heartbeat.stop()


def test_a_started_heartbeat_has_a_live_row_per_role_and_a_clean_stop_removes_them(
    runtime: Runtime, beating: Heartbeat
) -> None:
    rows = {row.kind: row for row in _rows(runtime)}
    assert set(rows) == {"relay", "projector"}
    relay = rows["relay"]
    assert (relay.serves, relay.threads, relay.live, relay.process_id) == ((SERVICE,), 2, True, beating.process_id)
    assert relay.pid > 0 and relay.host and relay.version
    beating.stop()
    assert _rows(runtime) == []


def test_a_row_is_stale_once_three_beats_are_missed_on_the_database_clock(runtime: Runtime, conn) -> None:
    heartbeat = Heartbeat([Role(Kind.RELAY, {SERVICE: [SERVICE]})], runtime.database, interval=10)
    heartbeat.beat_once()  # written, never beaten again: as after a SIGKILL
    try:
        clock.advance(conn, SERVICE, timedelta(seconds=10 * MISSED_BEATS - 1))
        assert [row.live for row in _rows(runtime)] == [True]
        clock.advance(conn, SERVICE, timedelta(seconds=2))
        assert [row.live for row in _rows(runtime)] == [False]
    finally:
        clock.reset(conn, SERVICE)


def test_beats_prune_the_rows_of_processes_gone_for_a_day(runtime: Runtime, conn) -> None:
    gone = Heartbeat([Role(Kind.WORKER, {SERVICE: [SERVICE]})], runtime.database, interval=1)
    gone.beat_once()
    try:
        clock.advance(conn, SERVICE, timedelta(days=1, seconds=1))
        Heartbeat([Role(Kind.RELAY, {SERVICE: [SERVICE]})], runtime.database, interval=1).beat_once()
        assert [row.kind for row in _rows(runtime)] == ["relay"]
    finally:
        clock.reset(conn, SERVICE)


def test_pending_outbox_rows_without_a_live_relay_are_flagged_and_a_live_relay_clears_it(
    runtime: Runtime, conn
) -> None:
    _write_pending_row(conn)
    liveness = read_liveness([SPEC], runtime.database, StubBroker())
    conditions = {(u.condition, u.subject, u.waiting) for u in liveness.unserved}
    assert (Condition.OUTBOX_WITHOUT_RELAY, SERVICE, 1) in conditions
    assert (Condition.PROJECTION_WITHOUT_PROJECTOR, PROJECTION, None) in conditions
    with Heartbeat([Role(Kind.RELAY, {SERVICE: [SERVICE]})], runtime.database, interval=60):
        liveness = read_liveness([SPEC], runtime.database, StubBroker())
        assert Condition.OUTBOX_WITHOUT_RELAY not in {u.condition for u in liveness.unserved}


def test_a_stale_relay_does_not_serve_its_outbox(runtime: Runtime, conn) -> None:
    _write_pending_row(conn)
    Heartbeat([Role(Kind.RELAY, {SERVICE: [SERVICE]})], runtime.database, interval=1).beat_once()
    try:
        clock.advance(conn, SERVICE, timedelta(seconds=MISSED_BEATS + 1))
        liveness = read_liveness([SPEC], runtime.database, StubBroker())
        assert Condition.OUTBOX_WITHOUT_RELAY in {u.condition for u in liveness.unserved}
        assert [row.live for _, row in liveness.heartbeats] == [False]
    finally:
        clock.reset(conn, SERVICE)


def test_waiting_messages_on_a_queue_nobody_consumes_are_flagged_until_a_worker_beats(runtime: Runtime) -> None:
    broker = StubBroker()
    broker.declare_queue(SERVICE)
    broker.enqueue(dramatiq.Message(queue_name=SERVICE, actor_name="probe.noop", args=(), kwargs={}, options={}))
    liveness = read_liveness([SPEC], runtime.database, broker)
    assert liveness.services[0].queue_waiting == 1
    assert [(u.condition, u.waiting) for u in liveness.unserved if u.condition is Condition.QUEUE_WITHOUT_CONSUMER] == [
        (Condition.QUEUE_WITHOUT_CONSUMER, 1)
    ]
    other_queue = Role(Kind.WORKER, {SERVICE: ["elsewhere"]})
    with Heartbeat([other_queue], runtime.database, interval=60):  # a worker of another queue serves nothing here
        assert Condition.QUEUE_WITHOUT_CONSUMER in {
            u.condition for u in read_liveness([SPEC], runtime.database, broker).unserved
        }
    with Heartbeat([Role(Kind.WORKER, {SERVICE: [SERVICE]})], runtime.database, interval=60):
        assert Condition.QUEUE_WITHOUT_CONSUMER not in {
            u.condition for u in read_liveness([SPEC], runtime.database, broker).unserved
        }


def test_a_worker_process_beats_its_queues_and_removes_its_rows_at_shutdown(runtime: Runtime) -> None:
    broker = StubBroker()
    broker.declare_queue(SERVICE)
    broker.add_middleware(WorkerHeartbeat(runtime, {SERVICE}))
    worker = dramatiq.Worker(broker, worker_threads=3, worker_timeout=50)
    worker.start()
    try:
        wait_until(lambda: len(_rows(runtime)) == 1, timeout=30, what="the worker's first beat")
        (row,) = _rows(runtime)
        assert (row.kind, row.serves, row.threads, row.live) == ("worker", (SERVICE,), 3, True)
        assert worker_roles(broker, worker, {SERVICE, "other"})[0].serves == {"other": ["other"], SERVICE: [SERVICE]}
    finally:
        worker.stop()
    assert _rows(runtime) == []


def test_one_unreachable_database_costs_only_its_own_service(runtime: Runtime, conn) -> None:
    from estafeta_sql.pool import Database

    dead = Database("postgresql://127.0.0.1:1/nothing?connect_timeout=1", timeout=1)
    try:
        liveness = read_liveness(
            [ServiceSpec("nowhere", has_queue=False), SPEC],
            lambda s: dead if s == "nowhere" else runtime.database(s),
            None,
        )
    finally:
        dead.close()
    nowhere, probe = liveness.services
    assert nowhere.error and nowhere.error.startswith("database:") and nowhere.unserved == []
    assert probe.error is None and probe.outbox_pending == 0


def test_the_gauges_say_what_the_conditions_say(runtime: Runtime, conn) -> None:
    _write_pending_row(conn)
    broker = StubBroker()
    broker.declare_queue(SERVICE)
    broker.enqueue(dramatiq.Message(queue_name=SERVICE, actor_name="probe.noop", args=(), kwargs={}, options={}))
    registry = CollectorRegistry()
    registry.register(LivenessCollector(lambda: read_liveness([SPEC], runtime.database, broker)))
    with Heartbeat([Role(Kind.PROJECTOR, {SERVICE: [PROJECTION]})], runtime.database, interval=60):
        sample = registry.get_sample_value
        assert sample("estafeta_outbox_pending_without_relay", {"service": SERVICE}) == 1
        assert sample("estafeta_queue_waiting_without_consumer", {"queue": SERVICE}) == 1
        assert sample("estafeta_projection_without_projector", {"service": SERVICE, "projection": PROJECTION}) == 0
        assert sample("estafeta_live_processes", {"service": SERVICE, "kind": "projector"}) == 1
        assert sample("estafeta_live_processes", {"service": SERVICE, "kind": "relay"}) == 0
        age = sample("estafeta_heartbeat_age_seconds", {"service": SERVICE, "kind": "projector"})
        assert age is not None and age >= 0


def test_status_prints_a_header_the_rows_and_what_nobody_serves_in_red(runtime: Runtime, conn) -> None:
    from estafeta_cli.status import render

    _write_pending_row(conn)
    Heartbeat([Role(Kind.RELAY, {SERVICE: [SERVICE]})], runtime.database, interval=1).beat_once()
    try:
        clock.advance(conn, SERVICE, timedelta(seconds=MISSED_BEATS + 1))
        text = render(read_liveness([SPEC], runtime.database, StubBroker()))
    finally:
        clock.reset(conn, SERVICE)
    lines = text.splitlines()
    assert lines[0].split() == [
        "SERVICE",
        "KIND",
        "SERVES",
        "HOST",
        "PID",
        "VERSION",
        "STARTED",
        "LAST",
        "BEAT",
        "STATE",
    ]
    red = "\x1b[31m"
    assert lines[1].startswith(red + SERVICE) and "stale" in lines[1]
    assert f"{red}\x1b[1moutbox {SERVICE}: 1 pending row(s) and no live relay" in text


def test_a_worker_process_of_an_app_with_schedules_and_projections_beats_as_scheduler_and_projector_too(
    runtime: Runtime,
) -> None:
    from types import SimpleNamespace

    from estafeta_actors.app import app as order_system
    from tests.ticker import app as ticker

    broker = StubBroker()
    for app in (ticker, order_system):
        app.bind(broker, runtime)
    worker = SimpleNamespace(consumer_whitelist=None, worker_threads=4)
    roles = {role.kind: role for role in worker_roles(broker, worker, ["ticker"])}
    assert roles[Kind.WORKER].serves == {"ticker": ["ticker"]}
    assert roles[Kind.SCHEDULER].serves == {"ticker": [s.full_name for s in ticker.schedules]}
    projections = {s.name: [p.name for p in s.projections] for s in order_system.services if s.projections}
    assert roles[Kind.PROJECTOR].serves == projections
