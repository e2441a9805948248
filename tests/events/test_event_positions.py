"""The integer high-water mark of the log, and why ``pg_snapshot_xmax`` cannot be its bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from estafeta.events.store import EventStore
from estafeta_sql import embedded, event_store

from .event_types import OrderCreated, registry
from .support import EventSchema, migrate_events


def created(order_id: str) -> OrderCreated:
    return OrderCreated(order_id, "c1", 100, "EUR")


def test_the_high_water_mark_waits_for_an_open_writer(event_schema: EventSchema, conn: psycopg.Connection[Any]) -> None:
    store = EventStore(event_schema.schema, registry)
    slow = event_schema.connect(autocommit=False)
    [held] = store.append(slow, "order-slow", [created("slow")])
    [later] = store.append(conn, "order-fast", [created("fast")])  # commits at once, after a smaller position
    assert held.position < later.position
    assert store.high_water_mark(conn, timeout=0.3) is None, "a position below the mark is not final yet"
    slow.commit()
    mark = store.high_water_mark(conn, timeout=60)
    assert mark is not None and mark >= later.position
    assert [e.stream_id for e in store.read_all(conn, up_to=mark)] == ["order-slow", "order-fast"]
    slow.close()


def test_pg_snapshot_xmax_is_not_a_bound_on_running_writers(tmp_path: Path) -> None:
    """DESIGN.md proposed: read the sequence (S), then X = pg_snapshot_xmax; once xmin reaches X, S is final.

    xmax is the last *completed* transaction id plus one, so a writer that is still running
    can hold an id at or above it: xmin reaches X while that writer's position (<= S) is
    still uncommitted. Transaction ids are server-wide and any transaction completing in
    between hides the case, so this runs on a private server (pgserver) where nothing else
    runs: there it happens every time.
    """
    dsn = embedded.start(tmp_path / "pgdata")
    with psycopg.connect(dsn, autocommit=True) as reader, psycopg.connect(dsn) as writer:
        migrate_events(reader, "shop")
        store = EventStore("shop", registry)
        for attempt in range(3):
            [pending] = store.append(writer, f"order-{attempt}", [created(str(attempt))])
            mark = event_store.last_position(reader, "shop")
            row = reader.execute(
                "SELECT pg_snapshot_xmax(s)::text::bigint, pg_snapshot_xmin(s)::text::bigint"
                " FROM pg_current_snapshot() s"
            ).fetchone()
            assert row is not None
            xmax, xmin = row
            assert xmin >= xmax, "the proposed rule now says: every position up to the mark is final"
            assert pending.position <= mark and pending.tx_id >= xmax
            visible = reader.execute("SELECT count(*) FROM shop.events WHERE position = %s", (pending.position,))
            assert visible.fetchone() == (0,), "yet the writer is still open: its position is not final"
            assert store.high_water_mark(reader, timeout=0.2) is None, "the mark of sql.event_store waits for it"
            writer.rollback()
