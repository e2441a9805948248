"""``python -m bench.step_protocol``: a step's first round trip as a pipeline, beside one simple-protocol query.

The statements of ``estafeta.steps.transaction.begin`` (count the delivery in a transaction of its
own, ``BEGIN``, the inbox record with the PostgreSQL lock, the savepoint), on a schema with the
``_common`` migrations, are sent ``--steps`` times on one connection, alternately (two
rounds each):

- ``pipeline``: ``_step_tx.begin`` itself, a psycopg pipeline (extended protocol; psycopg
  prepares the statements after five uses);
- ``simple``: the same named queries and lock statement bound on the client
  (``psycopg.ClientCursor.mogrify``) and sent as one multi-statement string, one
  simple-protocol message.

For each it prints the wall time, this process's CPU and the backend's CPU (``/proc``) per
step, so the cost moved between the client and the server shows.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from estafeta.locks.step_locks import PostgresLocks
from estafeta.steps.transaction import SAVEPOINT, begin
from estafeta_sql import inbox, migrate
from estafeta_sql.queries import query

from .common import describe, machine, scratch_database
from .cpu import process_cpu

#: A service schema with the inbox tables (the ``_common`` migrations).
SCHEMA = "bench"
CONSUMER = "bench.step"
LOCKS = PostgresLocks(timeout_ms=5000)

Opening = Callable[[psycopg.Connection[Any], uuid.UUID, str], tuple[int, bool]]


def pipeline(conn: psycopg.Connection[Any], message_id: uuid.UUID, key: str) -> tuple[int, bool]:
    """The first round trip as a step sends it: ``estafeta.steps.transaction.begin`` itself."""
    opened = begin(conn, SCHEMA, CONSUMER, message_id, key, lock_timeout_ms=LOCKS.timeout_ms)
    return opened.attempts, opened.first


def simple(conn: psycopg.Connection[Any], message_id: uuid.UUID, key: str) -> tuple[int, bool]:
    """The same statements, bound on the client, in one simple-protocol message."""
    cur = psycopg.ClientCursor(conn)
    params = inbox.attempt_params(CONSUMER, message_id, LOCKS.timeout_ms)
    statements = [
        "BEGIN",
        cur.mogrify(query("count_attempt", SCHEMA), params),
        "COMMIT",
        "BEGIN",
        cur.mogrify(query("record_inbox_and_lock", SCHEMA), {**params, "key": key, "wakeup": None}),
        f"SAVEPOINT {SAVEPOINT}",
    ]
    cur.execute("; ".join(statements))
    cur.nextset()  # past BEGIN: the count
    row = cur.fetchone()
    for _ in range(3):  # COMMIT, BEGIN, the inbox record
        cur.nextset()
    return int(row[0]) if row else 0, cur.rowcount == 1


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(dsn: str, opening: Opening, steps: int) -> dict[str, float]:
    """Microseconds per step: wall, client CPU, server CPU."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        wall, own, server = time.perf_counter(), _own_cpu(), process_cpu(pid)
        for n in range(steps):
            attempts, first = opening(conn, uuid.uuid4(), str(n))
            assert (attempts, first) == (1, True), (attempts, first)
            conn.execute("COMMIT")
        return {
            "wall": 1e6 * (time.perf_counter() - wall) / steps,
            "client_cpu": 1e6 * (_own_cpu() - own) / steps,
            "server_cpu": 1e6 * (process_cpu(pid) - server) / steps,
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_protocol", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    default_database = "host=127.0.0.1 port=5432 user=postgres dbname=test"
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", default_database))
    args = parser.parse_args()

    def prepare(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn, SCHEMA, migrate.load([migrate.builtin_directory("_common")]))

    with scratch_database(args.database_url, prepare) as dsn:
        print(f"the step's first round trip, {args.steps} steps per run: {describe(machine())}")
        print(f"{'run':<12}{'wall µs':>10}{'client CPU µs':>16}{'server CPU µs':>16}{'together':>10}")
        for name, opening in [("pipeline", pipeline), ("simple", simple)] * 2:
            r = measure(dsn, opening, args.steps)
            total = r["client_cpu"] + r["server_cpu"]
            print(f"{name:<12}{r['wall']:>10.0f}{r['client_cpu']:>16.0f}{r['server_cpu']:>16.0f}{total:>10.0f}")


if __name__ == "__main__":
    main()
