"""``python -m bench.order_history``: how far the order's history (the OrderSummary projection) lags its events.

Orders are placed at a steady rate; a StubBroker worker in this process runs their sagas
and, as every worker does, the app's projectors; a relay thread carries the outbox. For
every order, the lag of its last event is the time from the event's record to the
projector's write of the order's summary row (``projected_at``): one database clock.

``--database-url embedded`` (the default) measures on a private PostgreSQL server, with
no other transaction on it; a shared server's open transactions hold every projector
back (transaction ids are server-wide), so a DSN of a busy server shows that too.

``--cost N`` also measures what the history costs the sagas: N rounds of the orders placed
at once, run to the end without the history (no ``on_transition`` hook, no projector) and
with it, alternately; the medians in sagas per second.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import psycopg
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Settings, build_relay
from estafeta_actors.app import app
from estafeta_actors.order_saga import place_order
from estafeta_cli.seed import plan_orders, seed_services
from estafeta_sql import embedded

from .sagas import without_history

_LAG = """
WITH lag AS (
    SELECT 1000 * extract(epoch FROM projected_at - (timeline -> -1 ->> 'at')::timestamptz) AS ms
      FROM orders.order_summary WHERE customer_id LIKE %s)
SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),
       max(ms)
  FROM lag"""
_BEHIND = """
SELECT count(*) FROM orders.streams s LEFT JOIN orders.order_summary o ON s.stream_id = 'order-' || o.order_id
 WHERE s.type = 'order' AND s.version > coalesce(o.version, 0)"""
_LIVE = "SELECT count(*) FROM orders.saga_order WHERE status IN ('running', 'compensating')"


def _place(runtime: Runtime, count: int, rate: float, seed: int) -> None:
    plan = plan_orders(count, prefix=f"lag{seed}-", rng=random.Random(seed))
    seed_services(runtime, plan.balances, plan.stock)
    began = time.monotonic()
    for n, (customer, sku, quantity, amount) in enumerate(plan.orders):
        delay = began + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with runtime.database("orders").transaction() as conn:
            place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)


def _scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _wait(conn: psycopg.Connection[Any], timeout: float, *, projection: bool = True) -> None:
    """Until every saga has ended (and, with ``projection``, the summary has every event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _scalar(conn, _LIVE) == 0 and (not projection or _scalar(conn, _BEHIND) == 0):
            return
        time.sleep(0.1)
    raise SystemExit(f"sagas or the projection still behind after {timeout} s")


@contextlib.contextmanager
def _running(runtime: Runtime, *, history: bool) -> Iterator[None]:
    """A StubBroker worker (with the app's projectors when ``history``) and a relay, in this process."""
    with contextlib.nullcontext() if history else without_history():
        broker = StubBroker()
        broker.emit_after("process_boot")
        app.bind(broker, runtime, projectors=history)
        worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)
        worker.start()
        relay = build_relay(runtime, broker, app.service_names, poll_interval=0.2)
        stop = threading.Event()
        thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)
            worker.stop()


def _lag(runtime: Runtime, dsn: str, count: int, rate: float) -> str:
    seed = random.randrange(1_000_000)
    with _running(runtime, history=True):
        _place(runtime, count, rate, seed)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _wait(conn, 300)
            # Only this run's orders (the customers' prefix): the database may hold earlier runs'.
            n, p50, p99, top = conn.execute(_LAG, (f"lag{seed}-%",)).fetchone() or (0, None, None, None)
    figures = f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms"
    return f"order history lag (last event -> summary row), {n} orders: {figures}"


def _throughput(runtime: Runtime, dsn: str, count: int, *, history: bool) -> float:
    """Sagas per second for ``count`` orders placed at once (the history's events and projector on or off)."""
    with _running(runtime, history=history), psycopg.connect(dsn, autocommit=True) as conn:
        began = time.monotonic()
        _place(runtime, count, float("inf"), random.randrange(1_000_000))
        _wait(conn, 600, projection=False)
        return count / (time.monotonic() - began)


def main() -> None:
    """Place the orders, let the sagas and the projection finish, print the lag (and, with --cost, the cost)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="embedded", help="A scratch database (default: a private server).")
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0, help="Orders placed per second.")
    parser.add_argument("--cost", type=int, default=0, help="Also: N rounds of saga throughput without and with it.")
    args = parser.parse_args()
    dsn = embedded.start() if args.database_url == "embedded" else args.database_url
    runtime = Runtime(Settings(database_url=dsn))
    app.migrate(runtime)
    where = "a private server" if args.database_url == "embedded" else dsn
    print(f"{args.orders} orders at {args.rate:g}/s on {where}")
    print(_lag(runtime, dsn, args.orders, args.rate))
    rounds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.cost):
        for history in (False, True):
            rounds[history].append(_throughput(runtime, dsn, args.orders, history=history))
    if args.cost:
        off, on = (statistics.median(rounds[h]) for h in (False, True))
        print(
            f"sagas/s, {args.orders} orders at once, median of {args.cost}: without the history {off:.1f},"
            f" with it {on:.1f} ({on / off:.0%}); rounds {rounds}"
        )


if __name__ == "__main__":
    main()
