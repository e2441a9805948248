"""``python -m bench.step_protocol``: a step's first round trip as a pipeline, beside one simple-protocol query.

The statements of ``estafeta._step_tx.begin`` (count the delivery in a transaction of its
own, ``BEGIN``, the inbox record, the lock, the savepoint) are sent ``--steps`` times on one
connection, alternately (two rounds each):

- ``pipeline``: in a psycopg pipeline, as the step does (extended protocol; psycopg
  prepares the statements after five uses);
- ``simple``: as one multi-statement string bound on the client (``psycopg.ClientCursor``),
  one simple-protocol message.

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
from pathlib import Path
from typing import Any

import psycopg

from .common import describe, machine, scratch_database

TABLES = """CREATE SCHEMA bench;
CREATE TABLE bench.inbox_attempts (consumer text, message_id uuid, attempts int NOT NULL DEFAULT 1,
                                   PRIMARY KEY (consumer, message_id));
CREATE TABLE bench.inbox (consumer text, message_id uuid, PRIMARY KEY (consumer, message_id))"""
# The same statements as sql/queries.sql's count_attempt and record_inbox_forgetting_attempts,
# and PostgresLocks.statement().
COUNT = """INSERT INTO bench.inbox_attempts (consumer, message_id) SELECT %(consumer)s, %(message_id)s
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = inbox_attempts.attempts + 1 RETURNING attempts"""
INBOX = """WITH forgotten AS (
    DELETE FROM bench.inbox_attempts WHERE consumer = %(consumer)s AND message_id = %(message_id)s)
INSERT INTO bench.inbox (consumer, message_id) VALUES (%(consumer)s, %(message_id)s) ON CONFLICT DO NOTHING"""
LOCK = "SELECT set_config('lock_timeout', '5s', true), pg_advisory_xact_lock(hashtextextended(%(key)s, 0))"

Opening = Callable[[psycopg.Connection[Any], dict[str, Any]], tuple[int, bool]]


def pipeline(conn: psycopg.Connection[Any], params: dict[str, Any]) -> tuple[int, bool]:
    """The first round trip as ``_step_tx.begin`` sends it."""
    with conn.pipeline():
        conn.execute("BEGIN")
        counted = conn.execute(COUNT, params)
        conn.execute("COMMIT")
        conn.execute("BEGIN")
        recorded = conn.execute(INBOX, params)
        conn.execute(LOCK, params)
        conn.execute("SAVEPOINT estafeta_step")
    row = counted.fetchone()
    return int(row[0]) if row else 0, recorded.rowcount == 1


def simple(conn: psycopg.Connection[Any], params: dict[str, Any]) -> tuple[int, bool]:
    """The same statements in one simple-protocol message."""
    cur = psycopg.ClientCursor(conn)
    cur.execute(f"BEGIN; {COUNT}; COMMIT; BEGIN; {INBOX}; {LOCK}; SAVEPOINT estafeta_step", params)
    cur.nextset()  # past BEGIN: the count
    row = cur.fetchone()
    for _ in range(3):  # COMMIT, BEGIN, the inbox record
        cur.nextset()
    return int(row[0]) if row else 0, cur.rowcount == 1


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(dsn: str, opening: Opening, steps: int) -> dict[str, float]:
    """Microseconds per step: wall, client CPU, server CPU."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        wall, own, server = time.perf_counter(), _own_cpu(), _backend_cpu(pid)
        for n in range(steps):
            attempts, first = opening(conn, {"consumer": "bench", "message_id": uuid.uuid4(), "key": str(n)})
            assert (attempts, first) == (1, True), (attempts, first)
            conn.execute("COMMIT")
        return {
            "wall": 1e6 * (time.perf_counter() - wall) / steps,
            "client_cpu": 1e6 * (_own_cpu() - own) / steps,
            "server_cpu": 1e6 * (_backend_cpu(pid) - server) / steps,
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_protocol", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "host=127.0.0.1 port=5432 user=postgres dbname=test"),
    )
    args = parser.parse_args()

    def prepare(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLES)

    with scratch_database(args.database_url, prepare) as dsn:
        print(f"the step's first round trip, {args.steps} steps per run: {describe(machine())}")
        print(f"{'run':<12}{'wall µs':>10}{'client CPU µs':>16}{'server CPU µs':>16}{'together':>10}")
        for name, opening in [("pipeline", pipeline), ("simple", simple)] * 2:
            r = measure(dsn, opening, args.steps)
            total = r["client_cpu"] + r["server_cpu"]
            print(f"{name:<12}{r['wall']:>10.0f}{r['client_cpu']:>16.0f}{r['server_cpu']:>16.0f}{total:>10.0f}")


if __name__ == "__main__":
    main()
