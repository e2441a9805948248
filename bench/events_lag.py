"""Commit-to-projection lag of ``bench.events``: a writer process at a steady rate, a projector in this one.

The writer appends one event per transaction and notes, for each, its position and the
wall-clock time its commit returned; the projector notes when the batch holding it
committed. Lag is the difference (one machine, one clock).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import psycopg

from estafeta.events.projections import BatchResult, Projector
from estafeta.events.projector_run import run_projector
from estafeta.events.store import EventStore

from .events_workers import ItemAdded, registry


def steady_writer(dsn: str, schema: str, rate: float, seconds: float, queue: Any) -> None:
    """Append one event per transaction, ``rate`` a second, for ``seconds``; put ``[(position, commit time)]``."""
    store = EventStore(schema, registry)
    committed: list[tuple[int, float]] = []
    with psycopg.connect(dsn) as conn:
        began = time.monotonic()
        for n in range(int(rate * seconds)):
            delay = began + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            [recorded] = store.append(conn, f"cart-{n % 100}", [ItemAdded("sku", 1)])
            conn.commit()
            committed.append((recorded.position, time.time()))
    queue.put(committed)


def measure_lag(dsn: str, schema: str, projector: Projector, rate: float, seconds: float) -> tuple[list[float], float]:
    """Lags in milliseconds of every event written at ``rate`` events/s for ``seconds``.

    Also the age in seconds of the longest transaction of *another* database seen running
    meanwhile: transaction ids are server-wide, so it held the projection back too.
    """
    applied: dict[int, float] = {}

    def on_batch(_: Projector, result: BatchResult) -> None:
        now = time.time()
        for recorded in result.events:
            applied[recorded.position] = now

    stop = threading.Event()
    thread = threading.Thread(
        target=run_projector, args=(dsn, projector, stop), kwargs={"poll_interval": 1.0, "on_batch": on_batch}
    )
    thread.start()
    time.sleep(1.0)  # the projector is listening
    context = multiprocessing.get_context("spawn")
    queue: Any = context.Queue()
    writer = context.Process(target=steady_writer, args=(dsn, schema, rate, seconds, queue))
    writer.start()
    others = _OtherWriters(dsn)
    others.start()
    committed: list[tuple[int, float]] = queue.get(timeout=seconds + 120)
    writer.join(timeout=30)
    others.stop.set()
    others.join(timeout=10)
    deadline = time.monotonic() + 30
    while len(applied) < len(committed) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=30)
    missing = [position for position, _ in committed if position not in applied]
    if missing:
        raise RuntimeError(f"{len(missing)} events never reached the projection (first: position {missing[0]})")
    return [(applied[position] - at) * 1000 for position, at in committed], others.longest


class _OtherWriters(threading.Thread):
    """Samples, every 50 ms, the oldest writing transaction of other databases on the server."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.longest = 0.0

    def run(self) -> None:
        query = (
            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8 FROM pg_stat_activity"
            " WHERE backend_xid IS NOT NULL AND datname <> current_database()"
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                row = conn.execute(query).fetchone()
                self.longest = max(self.longest, float(row[0]) if row else 0.0)
