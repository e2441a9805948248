"""A rebuild side by side while writers append and the live projection keeps answering, then the switch-over."""

from __future__ import annotations

import random
import threading
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

from estafeta.events.projection_ops import RebuildError, projection_status, rebuild
from estafeta.events.projections import Projector
from estafeta.events.projector_run import run_projector
from estafeta.events.store import EventStore

from ..helpers import wait_until
from .support import EventSchema
from .workload import Deposited, Totals, registry, totals_of, truth


class TotalsV2(Totals):
    """The next release of the projection: one more column, which only a rebuild can fill."""

    tables: ClassVar[dict[str, str]] = {
        "totals": Totals.tables["totals"].replace(
            "out_of_order bigint", "release text NOT NULL DEFAULT 'v2', out_of_order bigint"
        )
    }


def columns(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return sorted(r[0] for r in rows)


@pytest.mark.integration
@pytest.mark.heavy
def test_a_rebuild_while_writers_run_switches_over_without_a_gap(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    dsn, schema = event_schema.dsn, event_schema.schema
    rng = random.Random(3)
    with conn.transaction():
        for _ in range(1000):
            store.append(conn, f"acct-{rng.randrange(40)}", [Deposited(rng.randint(1, 9)) for _ in range(5)])
    Projector(Totals(), store).create_tables(conn)
    stop_live, stop = threading.Event(), threading.Event()
    live = threading.Thread(
        target=run_projector, args=(dsn, Projector(Totals(), store), stop_live), kwargs={"poll_interval": 0.05}
    )
    live.start()
    try:
        wait_until(lambda: totals_of(conn, schema, "totals") == truth(conn, schema), timeout=90, what="the live one")
        result, answers, problems, progress = _rebuild_under_load(dsn, store, stop, rng)
        assert problems == [], "the live projection kept answering during the rebuild and the switch-over"
        assert answers and answers == sorted(answers), "readers never saw the read model go back"
        assert result.events_applied >= 5000 and progress[-1][0] >= 5000 and len(progress) >= 10
        assert "release" in columns(conn, schema, "totals"), "the rebuilt tables are live"
        assert columns(conn, schema, "totals__rebuild") == []
        indexes = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)).fetchall()
        assert ("totals_pkey",) in indexes and not [i for (i,) in indexes if "__rebuild" in i]
        # The same live projector carries on from the copy's checkpoint, on the new tables.
        with psycopg.connect(dsn, autocommit=True) as writer:
            store.append(writer, "acct-new", [Deposited(5)])
        wait_until(lambda: totals_of(conn, schema, "totals") == truth(conn, schema), timeout=90, what="the switch")
        assert [s.name for s in projection_status(conn, schema)] == ["totals"]
    finally:
        stop.set()
        stop_live.set()
        live.join(timeout=30)


def _rebuild_under_load(
    dsn: str, store: EventStore, stop: threading.Event, rng: random.Random
) -> tuple[Any, list[int], list[str], list[tuple[int, int]]]:
    """Rebuild while one thread appends and another reads the live table; stop both after the switch."""
    answers: list[int] = []
    problems: list[str] = []
    progress: list[tuple[int, int]] = []
    table = sql.SQL("SELECT sum(events) FROM {}").format(sql.Identifier(store.schema, "totals"))

    def write() -> None:
        with psycopg.connect(dsn, autocommit=True) as writer:
            while not stop.is_set():
                store.append(writer, f"acct-{rng.randrange(40)}", [Deposited(1), Deposited(2)])

    def read() -> None:
        with psycopg.connect(dsn, autocommit=True) as reader:
            while not stop.is_set():
                try:
                    row = reader.execute(table).fetchone()
                    answers.append(int(row[0]) if row and row[0] is not None else 0)
                except psycopg.Error as exc:
                    problems.append(str(exc))

    def note(done: int, total: int) -> None:
        progress.append((done, total))

    helpers = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in helpers:
        thread.start()
    try:
        result = rebuild(dsn, TotalsV2(), store, batch_size=500, progress=note)
    finally:
        stop.set()
        for thread in helpers:
            thread.join(timeout=30)
    return result, answers, problems, progress


def test_a_second_rebuild_of_the_same_projection_is_refused(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    holder = psycopg.connect(event_schema.dsn, autocommit=True)
    key = Projector(Totals(), store, rebuild=True).lock_key
    holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
    with pytest.raises(
        RebuildError, match=f"a rebuild of totals is already running \\(pid {holder.info.backend_pid}\\)"
    ):
        rebuild(event_schema.dsn, Totals(), store)
    holder.close()
