"""``python -m bench.events``: estafeta's event store beside the eventsourcing library's PostgreSQL recorder.

In one run, on one scratch database of the same PostgreSQL server:

- concurrent appends at 1, 4 and 8 writer processes, one event per transaction and batches
  of 50 (estafeta: lock-free, a row lock per stream; eventsourcing 9.5: ``LOCK TABLE ... IN
  EXCLUSIVE MODE`` on every insert, which serialises writers);
- catch-up reading of the whole log (estafeta: gap-safe ``(tx_id, position)`` batches, decoded
  into attrs events, and the raw rows; eventsourcing: ``select_notifications``);
- projection with a checkpoint per batch (a batch handler, and a handler per event);
- load time of a 10,000-event aggregate with and without snapshots (both libraries);
- commit-to-projection lag at a steady 500 events/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import psycopg
from psycopg import sql

from estafeta.events.aggregates import Aggregate, Repository, applies
from estafeta.events.projections import Projection, ProjectionContext, Projector, handles
from estafeta.events.store import EventStore, RecordedEvent
from estafeta_sql import event_store, migrate

from . import events_baselines as baselines
from .common import admin_dsn, machine, scratch_database
from .events_lag import measure_lag
from .events_workers import ItemAdded, estafeta_writer, eventsourcing_writer, registry, timed_writers

SCHEMA, LOG, LAG = "bench", "bench_log", "bench_lag"
TARGETS = {
    "append_4_vs_eventsourcing": 1.5,
    "append_8_vs_1": 1.5,
    "batched_append": 20_000,
    "catch_up": 50_000,
    "projection": 10_000,
    "snapshot_load_ms": 5.0,
    "lag_p99_ms": 200.0,
}


@attrs.define
class Cart(Aggregate):
    """A cart whose lines are events (snapshots every 100 events)."""

    snapshot_every: ClassVar[int | None] = 100
    items: int = 0

    @applies(ItemAdded)
    def _added(self, event: ItemAdded) -> None:
        self.items += event.quantity


@attrs.define
class ReplayedCart(Cart):
    """The same cart, never snapshotted."""

    snapshot_every = None


_LINES_DDL = "CREATE TABLE {lines} (stream_id text PRIMARY KEY, items bigint NOT NULL)"
_UPSERT = (
    "INSERT INTO {lines} AS l VALUES (%s, %s) ON CONFLICT (stream_id) DO UPDATE SET items = l.items + excluded.items"
)


class CartLines(Projection):
    """Items per cart, one upsert per event."""

    name = "cart_lines"
    tables: ClassVar[dict[str, str]] = {"lines": _LINES_DDL}

    @handles(ItemAdded)
    def added(self, ctx: ProjectionContext, recorded: RecordedEvent[ItemAdded]) -> None:
        ctx.execute(_UPSERT, (recorded.stream_id, recorded.event.quantity))


class CartLinesBatch(Projection):
    """Items per cart, one upsert per batch."""

    name = "cart_lines_batch"
    tables: ClassVar[dict[str, str]] = {"lines": _LINES_DDL}
    event_types = (ItemAdded,)

    def apply_batch(self, ctx: ProjectionContext, events: Sequence[RecordedEvent[Any]]) -> None:
        totals: dict[str, int] = {}
        for recorded in events:
            totals[recorded.stream_id] = totals.get(recorded.stream_id, 0) + recorded.event.quantity
        ctx.execute(
            _UPSERT.replace("VALUES (%s, %s)", "SELECT * FROM unnest(%s::text[], %s::bigint[])"),
            (list(totals), list(totals.values())),
        )


def prepare(dsn: str) -> None:
    """Migrate the benchmark's schemas (estafeta's store) and eventsourcing's tables."""
    directories = [migrate.builtin_directory("_common"), migrate.builtin_directory("_events")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in (SCHEMA, LOG, LAG):
            migrate.apply(conn, schema, migrate.load(directories))
    baselines.create_recorder_tables(dsn, "es_recorder")


def appends(dsn: str, seconds: float, rounds: int) -> dict[str, float]:
    """Events per second of both stores at 1, 4 and 8 writers, single events and batches of 50.

    Each figure is the median of ``rounds`` runs, the two stores taking turns, so that a
    burst of load from elsewhere on the machine hits both.
    """
    es = baselines.settings_for(dsn, "es_recorder")
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for batch in (1, 50):
            for writers in (1, 4, 8):
                ours = timed_writers(estafeta_writer, (dsn, SCHEMA, batch, seconds), writers)
                theirs = timed_writers(eventsourcing_writer, (es, batch, seconds), writers)
                samples.setdefault(f"estafeta/{batch}/{writers}", []).append(ours)
                samples.setdefault(f"eventsourcing/{batch}/{writers}", []).append(theirs)
    return {key: statistics.median(values) for key, values in samples.items()}


def fill_log(dsn: str, events: int) -> None:
    """``events`` events in LOG, 50 per append, 100 carts."""
    store = EventStore(LOG, registry)
    with psycopg.connect(dsn) as conn:
        for n in range(events // 50):
            store.append(conn, f"cart-{n % 100}", [ItemAdded("sku-42", 3)] * 50)
            if n % 20 == 19:
                conn.commit()
        conn.commit()


def wait_until_final(conn: psycopg.Connection[Any], schema: str, timeout: float = 300) -> None:
    """Wait until no event of ``schema`` is held back by a transaction still running on the server.

    Transaction ids are server-wide: on a shared server, someone else's open transaction
    delays the whole log; the timed reads start once it is all readable.
    """
    deadline = time.monotonic() + timeout
    while event_store.held_back(conn, schema, after=(0, 0)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"events of {schema} still held back after {timeout} s by an open transaction")
        time.sleep(0.05)


def catch_up(dsn: str, events: int) -> dict[str, float]:
    """Events per second reading LOG from the start, decoded and raw."""
    store = EventStore(LOG, registry)
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_until_final(conn, LOG)
        conn.execute(sql.SQL("SELECT count(*) FROM (SELECT * FROM {}.events) e").format(sql.Identifier(LOG)))  # warm
        for name, decode in (("raw", False), ("decoded", True)):
            began, after, read = time.perf_counter(), (0, 0), 0
            while True:
                rows = event_store.read_safe(conn, LOG, after=after, limit=1000)
                if not rows:
                    break
                if decode:
                    [store.decode(row) for row in rows]
                read, after = read + len(rows), (rows[-1].tx_id, rows[-1].position)
            found[name] = read / (time.perf_counter() - began)
            assert read == events, f"read {read} events of {events}"
    found["eventsourcing"] = baselines.catch_up_read(dsn, "es_recorder", events)
    return found


def projections(dsn: str, events: int) -> dict[str, float]:
    """Events per second projecting LOG from the start, a checkpoint per batch of 1000."""
    store = EventStore(LOG, registry)
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_until_final(conn, LOG)
        for projection in (CartLinesBatch(), CartLines()):
            projector = Projector(projection, store, batch_size=1000)
            projector.create_tables(conn)
            began, applied = time.perf_counter(), 0
            while True:
                result = projector.run_batch(conn)
                applied += result.applied
                if not result.more:
                    break
            found[projection.name] = applied / (time.perf_counter() - began)
            assert applied == events, f"{projection.name} applied {applied} of {events}"
            projector.drop_tables(conn)
    return found


def aggregate_loads(dsn: str, events: int, loads: int) -> dict[str, float]:
    """p50 milliseconds to load a cart of ``events`` events, with and without snapshots, in both libraries."""
    store = EventStore(SCHEMA, registry)
    carts, replayed = Repository(store, Cart), Repository(store, ReplayedCart)
    with psycopg.connect(dsn, autocommit=True) as conn:
        cart = Cart.new("cart-big")
        for _ in range(events // 100):
            for _line in range(100):
                cart.record(ItemAdded("sku-42", 3))
            carts.save(conn, cart)
        assert carts.load(conn, "cart-big").items == replayed.load(conn, "cart-big").items == 3 * events
        found = {
            "snapshots": _p50(lambda: carts.load(conn, "cart-big"), loads),
            "replay": _p50(lambda: replayed.load(conn, "cart-big"), max(3, loads // 20)),
        }
    found["es_snapshots"], found["es_replay"] = baselines.aggregate_load(dsn, "es_app", events, loads)
    return found


def _p50(load: Any, times: int) -> float:
    samples = []
    for _ in range(times):
        began = time.perf_counter()
        load()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def lag(dsn: str, rate: float, seconds: float) -> dict[str, float]:
    """Commit-to-projection lag percentiles (ms) at ``rate`` events/s."""
    projector = Projector(CartLinesBatch(), EventStore(LAG, registry), batch_size=1000)
    measured, others = measure_lag(dsn, LAG, projector, rate, seconds)
    lags = sorted(measured)
    found = {"p50": lags[len(lags) // 2], "p99": lags[int(len(lags) * 0.99)], "max": lags[-1], "events": len(lags)}
    return {**found, "other_writer_max_s": others}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, on a scratch database of the server ``args.dsn`` names."""
    with scratch_database(args.dsn, prepare) as dsn, psycopg.connect(dsn) as conn:
        version = conn.execute("SELECT version()").fetchone()
        found: dict[str, Any] = {"postgres": str(version[0] if version else "").split(" on ")[0]}
        found["append"] = appends(dsn, args.seconds, args.rounds)
        fill_log(dsn, args.events)
        found["catch_up"] = catch_up(dsn, args.events)
        found["projection"] = projections(dsn, args.events)
        found["aggregate"] = aggregate_loads(dsn, 10_000, args.loads)
        found["lag"] = lag(dsn, args.rate, args.lag_seconds)
    return found


def main(argv: list[str] | None = None) -> None:
    """Parse the options, measure, print the figures beside their baselines and targets."""
    parser = argparse.ArgumentParser(prog="python -m bench.events", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=admin_dsn(), help="a DSN of the server (libpq environment by default)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per append run")
    parser.add_argument("--rounds", type=int, default=3, help="append runs per figure (the median is shown)")
    parser.add_argument("--events", type=int, default=100_000, help="events read and projected")
    parser.add_argument("--loads", type=int, default=100, help="aggregate loads with snapshots")
    parser.add_argument("--rate", type=float, default=500.0, help="events/s of the lag measurement")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    found = run(args)
    if args.json:
        json.dump({"machine": machine(), "results": found}, sys.stdout, indent=2)
        return
    from .events_report import report

    print(report(found, machine(), TARGETS))


if __name__ == "__main__":
    main()
