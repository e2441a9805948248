"""A live projector with one event it cannot apply, and one projection it cannot even set up, among healthy ones.

What the projector does (the design's "one bad item stops only itself"): a projection that
cannot apply an event (``OnBadEvent.STOP``, the default) applies the events before it and
stops there, never skipping it: its checkpoint row says ``failed`` with the event's
position and the reason (``estafeta projections status``), ``estafeta_projection_bad_events``
counts it, and a restart after the fix retries that event. A projection with
``OnBadEvent.SKIP`` records the event in ``projection_dead_letters`` and goes on. A
projection whose tables cannot be created is recorded ``failed`` with the reason too. Every
other projection of the same projector process keeps following the log.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql

from estafeta.events.projection_ops import projection_status
from estafeta.events.projections import Projector
from estafeta.events.projector_run import run_projector, run_projectors
from estafeta.events.store import EventStore

from ..events.support import migrate_events
from ..events.test_projections import Lenient, deposit
from ..events.workload import BatchTotals, Totals, registry, totals_ddl, totals_of, truth
from ..helpers import wait_until


class Broken(Totals):
    """A projection whose table cannot be created (a type the database does not have)."""

    name = "broken"
    tables: ClassVar[dict[str, str]] = {"broken": "CREATE TABLE {broken} (stream_id no_such_type)"}
    table = "broken"


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    """An event store in a schema of its own in the run's database, dropped afterwards."""
    schema = f"blast_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        migrate_events(conn, schema)
    yield EventStore(schema, registry)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_one_event_a_projection_cannot_apply_stops_only_that_projection(database_url: str, store: EventStore) -> None:
    schema = store.schema
    projectors = [Projector(p, store, batch_size=5) for p in (Totals(), BatchTotals(), Lenient(), Broken())]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for projector in projectors[:3]:
            projector.create_tables(conn)
        for table in ("totals", "lenient"):  # a read-model rule the poisoned event breaks
            conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (amount >= 0)").format(sql.Identifier(schema, table)))
        for i in range(20):
            deposit(conn, store, f"acct-{i % 7}", i + 1, i + 2)
        stop = threading.Event()
        outcomes: dict[str, str] = {}
        thread = threading.Thread(
            target=lambda: outcomes.update(run_projectors(database_url, projectors, stop, poll_interval=0.05))
        )
        thread.start()
        try:
            _poison_and_keep_writing(conn, store, stop)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert outcomes == {"totals": "failed", "batch_totals": "stopped", "lenient": "stopped", "broken": "failed"}


def _poison_and_keep_writing(conn: psycopg.Connection[Any], store: EventStore, stop: threading.Event) -> None:
    schema = store.schema
    wait_until(lambda: totals_of(conn, schema, "batch_totals") == truth(conn, schema), 60, what="the first events")
    deposit(conn, store, "acct-poison", -5)  # decodes fine; breaks the CHECK of totals and lenient
    [poison] = conn.execute(sql.SQL("SELECT max(position) FROM {}.events").format(sql.Identifier(schema))).fetchone()
    for i in range(20):
        deposit(conn, store, f"acct-{i % 5}", 3)
    everything = truth(conn, schema)
    healthy = {stream: row for stream, row in everything.items() if stream != "acct-poison"}
    # Every other projection follows the log past the poisoned event, within a bounded time.
    wait_until(lambda: totals_of(conn, schema, "batch_totals") == everything, 60, what="batch_totals")
    wait_until(lambda: totals_of(conn, schema, "lenient") == healthy, 60, what="lenient, past its dead letter")
    status = {s.name: s for s in projection_status(conn, schema)}
    assert set(status) == {"totals", "batch_totals", "lenient", "broken"}
    # The poisoned one stopped at it, visibly, and skipped nothing.
    strict = status["totals"]
    assert (strict.state, strict.error_position, strict.lag_events) == ("failed", poison, 21)
    assert strict.last_error is not None and "CheckViolation" in strict.last_error
    assert strict.events_applied == 40 and "acct-poison" not in totals_of(conn, schema, "totals")
    labels = {"schema": schema, "projection": "totals", "outcome": "stopped"}
    assert REGISTRY.get_sample_value("estafeta_projection_bad_events_total", labels) == 1
    letters = conn.execute(
        sql.SQL("SELECT projection, position FROM {}.projection_dead_letters").format(sql.Identifier(schema))
    ).fetchall()
    assert letters == [("lenient", poison)]
    broken = status["broken"]
    assert broken.state == "failed" and broken.last_error is not None
    assert "could not create its tables" in broken.last_error and "no_such_type" in broken.last_error
    assert {s.state for s in status.values() if s.name in ("batch_totals", "lenient")} == {"running"}


class Fixed(Totals):
    """The next release of ``Broken``: the same projection, with tables the database can create."""

    name = "broken"
    tables: ClassVar[dict[str, str]] = {"broken": totals_ddl("broken")}
    table = "broken"


def test_a_projection_whose_tables_could_not_be_created_runs_again_once_they_can(
    database_url: str, store: EventStore
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        deposit(conn, store, "acct-1", 5)
        ended = threading.Event()
        assert run_projector(database_url, Projector(Broken(), store), ended) == "failed"
        ended.set()  # its NOTIFY listener
        [status] = projection_status(conn, store.schema)
        assert (status.state, status.error_position) == ("failed", None)
        stop = threading.Event()
        thread = threading.Thread(target=run_projector, args=(database_url, Projector(Fixed(), store), stop))
        thread.start()
        try:
            wait_until(lambda: projection_status(conn, store.schema)[0].events_applied == 1, 60, what="the fixed one")
            [status] = projection_status(conn, store.schema)
            assert (status.state, status.last_error) == ("running", None)
            assert totals_of(conn, store.schema, "broken") == truth(conn, store.schema)
        finally:
            stop.set()
            thread.join(timeout=30)
