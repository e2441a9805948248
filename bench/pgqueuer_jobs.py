"""pgqueuer's worker writing one row per job: the peer of estafeta's ping/pong step in ``bench.sagas``.

``python -m bench.pgqueuer_jobs`` (``BENCH_DSN`` and ``BENCH_PGQ_CONCURRENCY`` set) runs one
pgqueuer worker on asyncpg, its driver of choice; each job inserts one row into
``peer_writes`` through a pool of ``BENCH_PGQ_CONCURRENCY`` asyncpg connections, so that
many jobs write at once. bench/peers.py installs pgqueuer's schema,
enqueues the jobs before it starts the worker, and times them by the rows' own timestamps.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg
import psycopg
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries

ENTRYPOINT = "write_one_row"


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """asyncpg's keyword arguments for a libpq DSN (asyncpg takes no key=value strings)."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
    return {ours: parts[theirs] for theirs, ours in names.items() if parts.get(theirs) is not None}


async def prepare(dsn: str, jobs: int) -> None:
    """pgqueuer's schema in the benchmark's database, and ``jobs`` jobs enqueued (payload: the row's id)."""
    conn = await asyncpg.connect(**connect_kwargs(dsn))
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.schema_is_installed():
            await queries.install()
        for start in range(0, jobs, 1000):
            ids = range(start, min(start + 1000, jobs))
            await queries.enqueue([ENTRYPOINT] * len(ids), [str(n).encode() for n in ids], [0] * len(ids))
    finally:
        await conn.close()


async def work(dsn: str, concurrency: int) -> None:
    """Run the worker until the process is terminated."""
    kwargs = connect_kwargs(dsn)
    pool = await asyncpg.create_pool(min_size=concurrency, max_size=concurrency, **kwargs)
    pgq = PgQueuer.from_asyncpg_connection(await asyncpg.connect(**kwargs))

    @pgq.entrypoint(ENTRYPOINT)
    async def write_one_row(job: Job) -> None:
        """One row, in the job's own transaction (what a ping step writes, less the outbox and inbox)."""
        assert job.payload is not None
        await pool.execute("INSERT INTO peer_writes (id, done_at) VALUES ($1, clock_timestamp())", int(job.payload))

    # pgqueuer's own dequeue defaults (batches of 10, no cap on jobs in flight): the jobs' writes
    # wait for the pool's connections, so at most ``concurrency`` run at once. Tried here with
    # pgqueuer's hard cap instead (max_concurrent_tasks=8, which forces batches of 4): slower.
    await pgq.run()


if __name__ == "__main__":
    asyncio.run(work(os.environ["BENCH_DSN"], int(os.environ["BENCH_PGQ_CONCURRENCY"])))
