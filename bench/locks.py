"""``python -m bench.locks``: what a step's lock costs, per backend, beside the no-lock baseline.

Every operation is a step-shaped transaction on a scratch PostgreSQL database: insert an
inbox row, take the lock, do the work, run the fence check, commit, release. Rows:

- ``none``: the same transaction without a lock (the baseline; loses updates under contention);
- ``postgres``: ``pg_advisory_xact_lock`` (ESTAFETA_LOCK_URL=postgres);
- ``redis lease only``: a Redis lease without the fence (what redsync gives; unsafe);
- ``redis``: one Redis server, fenced (ESTAFETA_LOCK_URL=redis://...);
- ``redlock x3``: three private redis-server processes, fenced (needs redis-server on PATH).

Columns: one thread on one key (operations per second, p50/p99 latency); four threads on
four keys; eight threads on one key, whose work reads a counter, sleeps 0.5 ms and writes
it back (``lost`` counts the increments that vanished: only ``none`` should lose any).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import redis

from estafeta import Redlock
from estafeta.locks.step_locks import HeldLock, PostgresLocks, RedisLocks
from estafeta_sql import migrate
from estafeta_sql.pool import Database

from .common import add_database_url, describe, machine, redis_namespace, scratch_database

SCHEMA = "lockbench"
TIMEOUT_MS = 10_000
TTL_MS = 10_000

Hold = Callable[[psycopg.Connection[Any], str], contextlib.AbstractContextManager[HeldLock]]


class _NoLock:
    token = None

    def before_commit(self, conn: psycopg.Connection[Any]) -> None:
        return None


@contextlib.contextmanager
def _no_lock(conn: psycopg.Connection[Any], key: str) -> Iterator[HeldLock]:
    yield _NoLock()


def _lease_only(redlock: Redlock) -> Hold:
    @contextlib.contextmanager
    def hold(conn: psycopg.Connection[Any], key: str) -> Iterator[HeldLock]:
        lease = redlock.acquire(key, TTL_MS / 1000, TIMEOUT_MS / 1000)
        try:
            yield _NoLock()
        finally:
            lease.release()

    return hold


def _backend_hold(backend: PostgresLocks | RedisLocks, dsn: str) -> Hold:
    return lambda conn, key: backend.hold(conn, key, schema=SCHEMA, dsn=dsn)


def _operation(db: Database, hold: Hold, key: str, contended: bool) -> None:
    # As in a step: the lock is taken inside the transaction and released after it ended.
    with contextlib.ExitStack() as after_transaction, db.transaction() as conn:
        # Like a step: its inbox row first (every step writes, so every commit flushes).
        conn.execute("INSERT INTO lockbench.inbox (consumer, message_id) VALUES ('bench', gen_random_uuid())")
        held = after_transaction.enter_context(hold(conn, key))
        if contended:
            row = conn.execute("SELECT value FROM lockbench.counters WHERE key = %s", (key,)).fetchone()
            time.sleep(0.0005)
            conn.execute("UPDATE lockbench.counters SET value = %s WHERE key = %s", (row[0] + 1 if row else 1, key))
        held.before_commit(conn)


def _run(db: Database, hold: Hold, keys: list[str], threads: int, seconds: float, contended: bool) -> dict[str, Any]:
    latencies: list[float] = []
    done = [0] * threads
    errors = [0] * threads
    deadline = time.monotonic() + seconds

    def loop(index: int) -> None:
        key = keys[index % len(keys)]
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                _operation(db, hold, key, contended)
            except Exception:
                errors[index] += 1
                continue
            latencies.append(time.perf_counter() - started)
            done[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    ordered = sorted(latencies) or [0.0]
    return {
        "ops": sum(done),
        "ops_per_s": sum(done) / elapsed,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "errors": sum(errors),
    }


def measure(db: Database, name: str, hold: Hold, seconds: float) -> dict[str, Any]:
    """The three runs of one backend."""
    tag = uuid.uuid4().hex[:8]
    single = _run(db, hold, [f"{name}:{tag}:solo"], 1, seconds, contended=False)
    parallel = _run(db, hold, [f"{name}:{tag}:p{i}" for i in range(4)], 4, seconds, contended=False)
    key = f"{name}:{tag}:hot"
    with db.connection() as conn:
        conn.execute("INSERT INTO lockbench.counters (key, value) VALUES (%s, 0)", (key,))
    contended = _run(db, hold, [key], 8, seconds, contended=True)
    with db.connection() as conn:
        row = conn.execute("SELECT value FROM lockbench.counters WHERE key = %s", (key,)).fetchone()
    return {
        "backend": name,
        "single": single,
        "parallel_4_keys": parallel,
        "contended_1_key": {**contended, "lost_updates": contended["ops"] - (row[0] if row else 0)},
    }


@contextlib.contextmanager
def private_redis_servers(count: int) -> Iterator[list[str]]:
    """``count`` throw-away redis-server processes (none if redis-server is not installed)."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield []
        return
    procs, urls = [], []
    with tempfile.TemporaryDirectory() as directory:
        try:
            for _ in range(count):
                port = _free_port()
                argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                procs.append(subprocess.Popen(argv, cwd=directory, stdout=subprocess.DEVNULL))
                urls.append(f"redis://127.0.0.1:{port}/0")
            for url in urls:
                _wait_for(url)
            yield urls
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=1)
    for _ in range(200):
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            client.close()
            return
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not start")


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.apply(conn, SCHEMA, migrate.load([migrate.builtin_directory("_common")]))
        conn.execute("CREATE TABLE lockbench.counters (key text PRIMARY KEY, value bigint NOT NULL)")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with (
        scratch_database(args.database_url, _prepare) as dsn,
        redis_namespace(args.redis_url) as redis_url,
        private_redis_servers(3) as quorum,
    ):
        db = Database(dsn, max_size=12)
        backends: list[tuple[str, Callable[[], tuple[Hold, Callable[[], None]]]]] = [
            ("none", lambda: (_no_lock, lambda: None)),
            ("postgres", lambda: _with_backend(PostgresLocks(TIMEOUT_MS), dsn)),
            ("redis lease only", lambda: _lease_only_backend(redis_url)),
            ("redis", lambda: _with_backend(_redis_locks(redis_url), dsn)),
        ]
        if quorum:
            backends.append(("redlock x3", lambda: _with_backend(_redis_locks(",".join(quorum)), dsn)))
        try:
            for name, build in backends:
                hold, close = build()
                try:
                    results.append(measure(db, name, hold, args.seconds))
                finally:
                    close()
        finally:
            db.close()
    return results


def _redis_locks(url: str) -> RedisLocks:
    return RedisLocks(Redlock.from_url(url), ttl_ms=TTL_MS, timeout_ms=TIMEOUT_MS, pool_size=10)


def _with_backend(backend: PostgresLocks | RedisLocks, dsn: str) -> tuple[Hold, Callable[[], None]]:
    return _backend_hold(backend, dsn), backend.close


def _lease_only_backend(url: str) -> tuple[Hold, Callable[[], None]]:
    redlock = Redlock.from_url(url)
    return _lease_only(redlock), redlock.close


def table(results: list[dict[str, Any]], seconds: float) -> str:
    header = (
        f"{'backend':<18}{'1 thr ops/s':>12}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'4 thr/4 keys':>14}{'8 thr/1 key':>13}{'lost':>6}{'errors':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        s, p, c = r["single"], r["parallel_4_keys"], r["contended_1_key"]
        errors = s["errors"] + p["errors"] + c["errors"]
        lines.append(
            f"{r['backend']:<18}{s['ops_per_s']:>12.0f}{s['p50_ms']:>8.2f}{s['p99_ms']:>8.2f}"
            f"{p['ops_per_s']:>14.0f}{c['ops_per_s']:>13.0f}{c['lost_updates']:>6}{errors:>8}"
        )
    lines.append(f"\n{seconds:g} s per run; {describe(machine())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.locks", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each run (default 2)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_database_url(parser)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7"))
    args = parser.parse_args(argv)
    results = run(args)
    if args.json:
        json.dump({"machine": machine(), "seconds": args.seconds, "results": results}, sys.stdout, indent=2)
        print()
    else:
        print(table(results, args.seconds))


if __name__ == "__main__":
    main()
