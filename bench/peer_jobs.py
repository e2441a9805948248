"""The peers' jobs (see bench/peers.py): a procrastinate task that writes one row, a bare Dramatiq actor.

Imported by ``procrastinate --app=bench.peer_jobs.procrastinate_app worker`` (BENCH_DSN set)
and by ``dramatiq bench.peer_jobs`` (BENCH_AMQP_URL and BENCH_REDIS_URL set).
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
import procrastinate
import redis

#: procrastinate's app on the benchmark's database (its own async psycopg pool).
procrastinate_app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DSN", "")),
)


@procrastinate_app.task(name="write_one_row", pass_context=True)
async def write_one_row(context: procrastinate.JobContext, n: int) -> None:
    """One row, in the job's own transaction (what a ping step writes, less the outbox and inbox)."""
    await context.app.connector.execute_query_async(
        "INSERT INTO peer_writes (id, done_at) VALUES (%(n)s, clock_timestamp())", n=n
    )


def prepare_procrastinate(dsn: str, jobs: int) -> None:
    """procrastinate's schema in the benchmark's database, and ``jobs`` jobs deferred."""
    from procrastinate import tasks

    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
    with app.open():
        app.schema_manager.apply_schema()
        deferrer = tasks.configure_task(name="write_one_row", job_manager=app.job_manager)
        for start in range(0, jobs, 1000):
            batch: list[Any] = [{"n": n} for n in range(start, min(start + 1000, jobs))]
            deferrer.batch_defer(*batch)


_TICKS = os.environ.get("BENCH_TICKS_KEY", "estafeta-bench-ticks")
_redis: Any = None

if os.environ.get("BENCH_AMQP_URL"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    dramatiq.set_broker(RabbitmqBroker(url=os.environ["BENCH_AMQP_URL"]))
    _redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])

    @dramatiq.actor(queue_name="bench_peer", max_retries=0)
    def tick() -> None:
        """Nothing but a note that it ran: count, first and last time, in one round trip."""
        now = time.time()
        pipe = _redis.pipeline(transaction=False)
        pipe.incr(f"{_TICKS}:count")
        pipe.set(f"{_TICKS}:first", now, nx=True)
        pipe.set(f"{_TICKS}:last", now)
        pipe.execute()


def prepare_dramatiq(amqp_url: str, redis_url: str, messages: int) -> str:
    """``messages`` bare messages waiting in RabbitMQ before the workers start; return the tick key."""
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=amqp_url)
    client = redis.Redis.from_url(redis_url)
    client.delete(f"{_TICKS}:count", f"{_TICKS}:first", f"{_TICKS}:last")
    broker.declare_queue("bench_peer")
    for _ in range(messages):
        broker.enqueue(dramatiq.Message(queue_name="bench_peer", actor_name="tick", args=(), kwargs={}, options={}))
    broker.close()
    client.close()
    return _TICKS


def wait_for_ticks(redis_url: str, key: str, count: int, timeout: float = 600) -> float:
    """Seconds from the first tick to the last, once ``count`` ticks were counted."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if int(client.get(f"{key}:count") or 0) >= count:
                return float(client.get(f"{key}:last") or 0) - float(client.get(f"{key}:first") or 0)
            time.sleep(0.1)
    finally:
        client.close()
    raise RuntimeError(f"the bare Dramatiq actor did not process {count} messages within {timeout:g} s")


def forget(amqp_url: str, redis_url: str, key: str) -> None:
    """Remove the peer's queue and counters."""
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=amqp_url)
    broker.declare_queue("bench_peer")
    broker.flush_all()
    broker.close()
    client = redis.Redis.from_url(redis_url)
    client.delete(f"{key}:count", f"{key}:first", f"{key}:last")
    client.close()
