"""``python -m bench.es_adapter``: estafeta.eventsourcing beside the library's own PostgreSQL recorder.

The same ``insert_events`` calls (one transaction each: single events and batches of 50, by
1 and 4 writer processes, each on its own aggregates), then reading the whole notification
log with ``select_notifications``, pages of 1000, on a scratch database. The library's
recorder serialises writers with ``LOCK TABLE``; the adapter holds a lock only while a
batch's ``INSERT`` runs, and reads stop at the high-water mark.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from .common import admin_dsn, describe, machine, scratch_database
from .events_baselines import catch_up_read, create_recorder_tables, settings_for
from .events_workers import eventsourcing_writer, recorder_writes, timed_writers

ADAPTER = "es_adapter"
LIBRARY = "es_recorder"


def _factory(dsn: str) -> Any:
    from estafeta.eventsourcing import Factory

    return Factory({"ESTAFETA_DATABASE_URL": dsn, "ESTAFETA_SCHEMA": ADAPTER, "ESTAFETA_POOL_SIZE": "1"})


def adapter_writer(dsn: str, batch: int, seconds: float, start: Any, index: int) -> int:
    """``insert_events`` of ``batch`` events for ``seconds`` after ``start``; the events committed."""
    factory = _factory(dsn)
    done = recorder_writes(factory.application_recorder(), batch, seconds, start)
    factory.close()
    return done


def adapter_catch_up(dsn: str, limit: int, page: int = 1000) -> float:
    """Events per second reading the adapter's notification log from the start."""
    factory = _factory(dsn)
    recorder = factory.application_recorder()
    began, read, last = time.perf_counter(), 0, 0
    while read < limit:
        notifications = recorder.select_notifications(start=last, limit=page, inclusive_of_start=False)
        if not notifications:
            break
        read, last = read + len(notifications), notifications[-1].id
    elapsed = time.perf_counter() - began
    factory.close()
    return read / elapsed


def prepare(dsn: str) -> None:
    """The adapter's schema (estafeta's migrations) and the library's recorder tables."""
    _factory(dsn).close()
    create_recorder_tables(dsn, LIBRARY)


def run(args: argparse.Namespace) -> dict[str, float]:
    """Medians of ``args.rounds`` runs per figure, the two recorders taking turns."""
    samples: dict[str, list[float]] = {}
    with scratch_database(args.dsn, prepare) as dsn:
        library = settings_for(dsn, LIBRARY)
        for _ in range(args.rounds):
            for batch in (1, 50):
                for writers in (1, 4):
                    ours = timed_writers(adapter_writer, (dsn, batch, args.seconds), writers)
                    theirs = timed_writers(eventsourcing_writer, (library, batch, args.seconds), writers)
                    samples.setdefault(f"insert {batch:>2} x {writers} writers, estafeta.eventsourcing", []).append(
                        ours
                    )
                    samples.setdefault(f"insert {batch:>2} x {writers} writers, eventsourcing.postgres", []).append(
                        theirs
                    )
        with psycopg.connect(dsn) as conn:
            row = conn.execute(f"SELECT count(*) FROM {ADAPTER}.events").fetchone()
            events = int(row[0]) if row else 0
        samples["catch-up read, estafeta.eventsourcing"] = [adapter_catch_up(dsn, events)]
        samples["catch-up read, eventsourcing.postgres"] = [catch_up_read(dsn, LIBRARY, events)]
    return {key: statistics.median(values) for key, values in samples.items()}


def main(argv: list[str] | None = None) -> None:
    """Measure and print events per second for both recorders."""
    parser = argparse.ArgumentParser(prog="python -m bench.es_adapter", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=admin_dsn(), help="a DSN of the server (libpq environment by default)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per insert run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per figure (the median is shown)")
    args = parser.parse_args(argv)
    found = run(args)
    print(f"eventsourcing recorders; {describe(machine())}")
    for name, value in found.items():
        print(f"  {name:<58} {value:>10,.0f} events/s")


if __name__ == "__main__":
    main()
