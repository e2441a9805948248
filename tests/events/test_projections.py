"""Projectors: batches with their checkpoint, bad input, one projector per projection, wake-ups, status."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql
from psycopg.types.json import Jsonb

from estafeta.events.projection_ops import projection_status
from estafeta.events.projections import OnBadEvent, Projection, ProjectionContext, Projector
from estafeta.events.projector_run import run_projector
from estafeta.events.store import EventStore, RecordedEvent
from estafeta_sql import event_store, projection_store

from ..helpers import wait_until
from .support import EventSchema
from .workload import BatchTotals, Deposited, Totals, registry, totals_of, truth


def deposit(conn: psycopg.Connection[Any], store: EventStore, stream: str, *amounts: int) -> None:
    store.append(conn, stream, [Deposited(a) for a in amounts])


def raw_event(conn: psycopg.Connection[Any], schema: str, stream: str, type_: str, version: int, data: Any) -> int:
    """An event the projection cannot read, as a newer release or a broken tool might write it."""
    row = conn.execute(
        sql.SQL(
            "WITH s AS (INSERT INTO {s}.streams (stream_id, type, version, last_tx_id)"
            " VALUES (%s, 'acct', 1, pg_current_xact_id())"
            " ON CONFLICT (stream_id) DO UPDATE SET version = {s}.streams.version + 1 RETURNING version)"
            " INSERT INTO {s}.events (stream_id, version, event_id, type, schema_version, data)"
            " SELECT %s, s.version, gen_random_uuid(), %s, %s, %s FROM s RETURNING position"
        ).format(s=sql.Identifier(schema)),
        (stream, stream, type_, version, Jsonb(data)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def catch_up(conn: psycopg.Connection[Any], projector: Projector, timeout: float = 90.0) -> int:
    """Run batches until nothing is left to read, waiting out other suites' open transactions; the events applied.

    Transaction ids are server-wide: a transaction of another test run, open for a moment,
    holds our committed events back (never skips them), so "caught up" means nothing held back.
    """
    applied, deadline, after = 0, time.monotonic() + timeout, (0, 0)
    while time.monotonic() < deadline:
        # Asked before the batch: if nothing is held back now, the batch reads all that committed.
        waiting = event_store.held_back(conn, projector.schema, after=after)
        result = projector.run_batch(conn)
        applied, after = applied + result.applied, result.checkpoint
        if result.failed is not None:
            return applied
        if not result.more and not waiting:
            return applied
        if not result.more:
            time.sleep(0.01)
    raise AssertionError(f"events still held back after {timeout} s")


@pytest.fixture
def store(event_schema: EventSchema) -> EventStore:
    return EventStore(event_schema.schema, registry)


@pytest.fixture
def running(event_schema: EventSchema) -> Iterator[list[threading.Thread]]:
    """Threads started by a test, stopped by the ``stop`` event stored on each."""
    threads: list[threading.Thread] = []
    yield threads
    for thread in threads:
        thread.stop.set()  # type: ignore[attr-defined]
        thread.join(timeout=20)


def start(dsn: str, projector: Projector, threads: list[threading.Thread], **kwargs: Any) -> threading.Thread:
    stop = threading.Event()
    outcome: dict[str, str] = {}
    thread = threading.Thread(
        target=lambda: outcome.setdefault("outcome", run_projector(dsn, projector, stop, **kwargs))
    )
    thread.stop = stop  # type: ignore[attr-defined]
    thread.outcome = outcome  # type: ignore[attr-defined]
    thread.start()
    threads.append(thread)
    return thread


def test_a_batch_applies_events_and_moves_the_checkpoint_once(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore
) -> None:
    deposit(conn, store, "acct-1", 10, 20)
    deposit(conn, store, "acct-2", 5)
    projector = Projector(Totals(), store, batch_size=2)
    projector.create_tables(conn)
    assert catch_up(conn, projector) == 3
    assert catch_up(conn, projector) == 0, "nothing is applied twice"
    assert totals_of(conn, store.schema, "totals") == truth(conn, store.schema)
    [checkpoint] = projection_store.list_checkpoints(conn, store.schema)
    assert checkpoint.events_applied == 3 and checkpoint.position == 3


def test_a_checkpoint_never_moves_back(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore
) -> None:
    deposit(conn, store, "acct-1", 1, 2, 3)
    projector = Projector(Totals(), store)
    projector.create_tables(conn)
    assert catch_up(conn, projector) == 3
    [at] = projection_store.list_checkpoints(conn, store.schema)
    # Back one event, back to the start, or in place (the last event counted twice): all refused.
    for earlier in ((at.tx_id, at.position - 1), (0, 0), at.after):
        moved = projection_store.advance_checkpoint(conn, store.schema, "totals", after=earlier, applied=1)
        assert not moved, f"the checkpoint at {at.after} moved to {earlier}"
    [still] = projection_store.list_checkpoints(conn, store.schema)
    assert (still.after, still.events_applied) == (at.after, 3)
    deposit(conn, store, "acct-1", 4)
    assert catch_up(conn, projector) == 1, "the next batch reads on from where it was, applying nothing twice"
    assert totals_of(conn, store.schema, "totals") == truth(conn, store.schema)


def test_a_batch_projection_and_a_per_event_one_agree(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore
) -> None:
    for i in range(30):
        deposit(conn, store, f"acct-{i % 4}", i, i + 1)
    for projection in (Totals(), BatchTotals()):
        projector = Projector(projection, store, batch_size=7)
        projector.create_tables(conn)
        catch_up(conn, projector)
    assert totals_of(conn, store.schema, "totals") == totals_of(conn, store.schema, "batch_totals")
    assert totals_of(conn, store.schema, "totals") == truth(conn, store.schema)


class Strict(Totals):
    """Stops on the first event it cannot apply (the default)."""


class Lenient(Totals):
    """Dead-letters what it cannot apply and goes on."""

    name = "lenient"
    tables: ClassVar[dict[str, str]] = {"lenient": Totals.tables["totals"].replace("{totals}", "{lenient}")}
    table = "lenient"
    on_bad_event = OnBadEvent.SKIP


class Audit(Projection):
    """Every event of the store, whatever its type: an unknown type is bad input here."""

    name = "audit"
    tables: ClassVar[dict[str, str]] = {"audit": "CREATE TABLE {audit} (position bigint PRIMARY KEY, type text)"}
    handles_any = True

    def apply_any(self, ctx: ProjectionContext, recorded: RecordedEvent[Any]) -> None:
        ctx.execute("INSERT INTO {audit} VALUES (%s, %s)", (recorded.position, recorded.type))


@pytest.mark.parametrize(
    ("projection", "type_", "version", "data", "reason"),
    [
        (Strict(), "Deposited", 1, {"amount": "lots"}, "not a valid Deposited v1"),
        (Strict(), "Deposited", 2, {"amount": 1}, "Deposited schema version 2 is unknown here"),
        (Strict(), "Deposited", 1, {"amount": -5}, "CheckViolation"),  # the handler's write fails
        (Audit(), "Withdrawn", 1, {"amount": 1}, "unknown event type 'Withdrawn'"),
    ],
)
def test_a_bad_event_stops_the_projection_visibly_at_its_position(
    event_schema: EventSchema,
    conn: psycopg.Connection[Any],
    store: EventStore,
    running: list[threading.Thread],
    projection: Projection,
    type_: str,
    version: int,
    data: Any,
    reason: str,
) -> None:
    deposit(conn, store, "acct-1", 10)
    bad = raw_event(conn, store.schema, "acct-2", type_, version, data)
    deposit(conn, store, "acct-3", 30)
    projector = Projector(projection, store)
    projector.create_tables(conn)
    for table in projection.tables:  # a read-model rule the handler can break
        if table == "totals":
            conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (amount >= 0)").format(projector.table(table)))
    thread = start(event_schema.dsn, projector, running, poll_interval=0.05)
    thread.join(timeout=20)
    assert thread.outcome == {"outcome": "failed"}  # type: ignore[attr-defined]
    [status] = projection_status(conn, store.schema)
    assert status.state == "failed" and status.error_position == bad
    assert status.last_error is not None and f"event at position {bad}" in status.last_error
    assert reason in status.last_error
    assert status.events_applied == 1 and status.lag_events == 2, "the event before it applied, none after"


def test_a_skipping_projection_dead_letters_the_bad_event_and_goes_on(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore
) -> None:
    deposit(conn, store, "acct-1", 10)
    bad = raw_event(conn, store.schema, "acct-2", "Deposited", 1, {"amount": None})
    deposit(conn, store, "acct-3", 30)
    projector = Projector(Lenient(), store)
    projector.create_tables(conn)
    assert catch_up(conn, projector) == 2
    assert set(totals_of(conn, store.schema, "lenient")) == {"acct-1", "acct-3"}
    letters = conn.execute(
        sql.SQL("SELECT projection, position, stream_id, reason FROM {}.projection_dead_letters").format(
            sql.Identifier(store.schema)
        )
    ).fetchall()
    assert [(name, position, stream) for name, position, stream, _ in letters] == [("lenient", bad, "acct-2")]
    assert "not a valid Deposited v1" in letters[0][3]
    [status] = projection_status(conn, store.schema)
    assert (status.state, status.lag_events) == ("stopped", 0)


def test_a_long_open_writer_delays_the_projection_never_makes_it_skip(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore, running: list[threading.Thread]
) -> None:
    projector = Projector(Totals(), store)
    start(event_schema.dsn, projector, running, poll_interval=0.05)
    slow = event_schema.connect(autocommit=False)
    deposit(slow, store, "acct-slow", 100)  # position 1, left open
    deposit(conn, store, "acct-fast", 1)  # position 2, committed
    slow_pid = slow.info.backend_pid
    time.sleep(0.5)
    assert totals_of(conn, store.schema, "totals") == {}, "position 2 must wait for the open position 1"
    writer = projection_store.oldest_writer(conn)
    assert writer is not None and writer.age_seconds >= 0.4
    # Transaction ids are server-wide: another suite's older transaction may be the oldest.
    assert (
        writer.pid == slow_pid or writer.xid < slow.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
    )  # type: ignore[index]
    [status] = projection_status(conn, store.schema)
    assert status.lag_events == 1 and status.lag_seconds > 0.3 and status.state == "running"
    labels = {"schema": store.schema, "projection": "totals"}

    def gauges_show_the_delay() -> bool:
        seconds = REGISTRY.get_sample_value("estafeta_projection_lag_seconds", labels) or 0
        writer_age = (
            REGISTRY.get_sample_value("estafeta_projection_oldest_writer_age_seconds", {"schema": store.schema}) or 0
        )
        return REGISTRY.get_sample_value("estafeta_projection_lag_events", labels) == 1 and seconds > 0.3 < writer_age

    wait_until(gauges_show_the_delay, what="the lag gauges (refreshed every second)")
    slow.commit()
    wait_until(lambda: totals_of(conn, store.schema, "totals") == truth(conn, store.schema), timeout=60)
    slow.close()


def test_one_projector_per_projection_and_a_standby_takes_over(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore, running: list[threading.Thread]
) -> None:
    first = start(event_schema.dsn, Projector(Totals(), store), running, poll_interval=0.05)
    wait_until(lambda: projection_status(conn, store.schema) != [], what="the first projector")
    second = start(event_schema.dsn, Projector(Totals(), store), running, poll_interval=0.05)
    deposit(conn, store, "acct-1", 1)
    wait_until(lambda: totals_of(conn, store.schema, "totals") == truth(conn, store.schema), timeout=60)
    [status] = projection_status(conn, store.schema)
    assert status.projector_pid is not None and status.state == "running"
    assert second.is_alive(), "the second projector waits as a standby"
    first.stop.set()  # type: ignore[attr-defined]
    conn.execute("SELECT pg_terminate_backend(%s)", (status.projector_pid,))
    first.join(timeout=10)
    deposit(conn, store, "acct-1", 2)
    wait_until(lambda: totals_of(conn, store.schema, "totals") == truth(conn, store.schema), 60, what="the standby")
    [after] = projection_status(conn, store.schema)
    assert after.projector_pid not in (None, status.projector_pid)


def test_notify_wakes_the_projector_long_before_its_poll(
    event_schema: EventSchema, conn: psycopg.Connection[Any], store: EventStore, running: list[threading.Thread]
) -> None:
    start(event_schema.dsn, Projector(Totals(), store), running, poll_interval=60)
    wait_until(lambda: projection_status(conn, store.schema) != [], what="the projector")
    time.sleep(0.3)
    began = time.monotonic()
    deposit(conn, store, "acct-1", 5)
    wait_until(lambda: totals_of(conn, store.schema, "totals") == truth(conn, store.schema), timeout=20)
    assert time.monotonic() - began < 15, "woken by the append's NOTIFY, not by the 60 s poll"
