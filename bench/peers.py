"""The peers ``python -m bench.sagas`` measures estafeta's steps against, in the same run.

- procrastinate's worker (PostgreSQL job queue; ``--concurrency 8``) running a job that
  writes one row, on the same database server;
- pgqueuer's worker (PostgreSQL job queue on asyncpg; at most 8 jobs in flight) running a
  job that writes one row, on the same database (bench/pgqueuer_jobs.py);
- a bare Dramatiq actor on the same RabbitMQ, ``dramatiq`` with the same processes and
  threads as estafeta's workers, doing nothing but noting that it ran;
- DBOS Transact running the order saga as a durable workflow (bench/peer_dbos.py).

Both are timed from the first to the last job's own timestamp, as the estafeta figures
are, so process start-up is not counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

#: The jobs' own module, imported by the peers' worker processes.
_PROCRASTINATE_APP = "bench.peer_jobs.procrastinate_app"
_DRAMATIQ_MODULE = "bench.peer_jobs"


def procrastinate_rate(dsn: str, jobs: int, concurrency: int = 8) -> dict[str, Any]:
    """procrastinate's worker: jobs per second, each writing one row in a transaction of its own."""
    from bench import peer_jobs

    env = {**os.environ, "BENCH_DSN": dsn, "PYTHONPATH": str(ROOT)}
    _fresh_peer_writes(dsn)
    peer_jobs.prepare_procrastinate(dsn, jobs)
    # Warnings only: its per-job INFO lines would cost it time a production worker does not spend.
    argv = [str(BIN / "procrastinate"), f"--app={_PROCRASTINATE_APP}", "--log-level", "warning",
            "worker", "--concurrency", str(concurrency)]  # fmt: skip
    return _peer_writes_rate(dsn, argv, env, jobs, concurrency)


def pgqueuer_rate(dsn: str, jobs: int, concurrency: int = 8) -> dict[str, Any]:
    """pgqueuer's worker on asyncpg: jobs per second, each writing one row in a transaction of its own."""
    import asyncio

    from bench import pgqueuer_jobs

    _fresh_peer_writes(dsn)
    asyncio.run(pgqueuer_jobs.prepare(dsn, jobs))
    env = {**os.environ, "BENCH_DSN": dsn, "BENCH_PGQ_CONCURRENCY": str(concurrency), "PYTHONPATH": str(ROOT)}
    return _peer_writes_rate(dsn, [sys.executable, "-m", "bench.pgqueuer_jobs"], env, jobs, concurrency)


def _peer_writes_rate(dsn: str, argv: list[str], env: dict[str, str], jobs: int, concurrency: int) -> dict[str, Any]:
    """Run a peer's worker until its ``jobs`` rows are in ``peer_writes``; the rate by the rows' own timestamps."""
    worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seconds = _wait_for_rows(dsn, "SELECT count(*), extract(epoch FROM max(done_at) - min(done_at))"
                                 " FROM peer_writes", jobs)  # fmt: skip
    finally:
        worker.terminate()
        worker.wait(30)
    return {"jobs": jobs, "seconds": seconds, "per_second": (jobs - 1) / seconds, "concurrency": concurrency}


def _fresh_peer_writes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS peer_writes")
        conn.execute("CREATE TABLE peer_writes (id int PRIMARY KEY, done_at timestamptz NOT NULL)")


def dramatiq_rate(amqp_url: str, redis_url: str, messages: int, processes: int, threads: int = 8) -> dict[str, Any]:
    """A bare Dramatiq actor on RabbitMQ: messages per second end to end (enqueued before the workers start)."""
    from bench import peer_jobs

    env = {**os.environ, "BENCH_AMQP_URL": amqp_url, "BENCH_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    key = peer_jobs.prepare_dramatiq(amqp_url, redis_url, messages)
    argv = [str(BIN / "dramatiq"), _DRAMATIQ_MODULE, "--processes", str(processes), "--threads", str(threads)]
    workers = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        seconds = peer_jobs.wait_for_ticks(redis_url, key, messages)
    finally:
        workers.terminate()
        workers.wait(30)
        peer_jobs.forget(amqp_url, redis_url, key)
    return {"messages": messages, "seconds": seconds, "per_second": (messages - 1) / seconds}


def _wait_for_rows(dsn: str, query: str, count: int, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query).fetchone()
            if row and int(row[0]) >= count:
                return float(row[1])
            time.sleep(0.2)
    raise RuntimeError(f"the peer did not finish {count} jobs within {timeout:g} s")
