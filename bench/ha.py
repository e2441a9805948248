"""``python -m bench.ha``: the order system on a three-node RabbitMQ cluster with quorum queues, beside one node.

In one run, on a scratch PostgreSQL database and RabbitMQ nodes of the benchmark's own
(Debian's ``rabbitmq-server``, started as the test suite starts them, tests/rabbit_servers.py):

- order sagas placed at once, on one node with classic queues, then on three clustered
  nodes with quorum queues (``ESTAFETA_RABBITMQ_QUEUE_TYPE=quorum``, the URL naming the
  three): sagas per second and latency from placing to the end, p50 and p99;
- commit-to-publish latency through ``estafeta relay`` (bench/relay_latency.py), one outbox
  row a transaction at ``--rate`` a second, p50 and p99, on each;
- failover, ``--failovers`` times: the node leading the ``orders`` queue SIGKILLed with
  the workers and the relay idle, one order placed at once, and the time from the kill to
  its first committed step (the order's ``orders.place`` in the inbox, by the database's
  clock): the relay and the workers reconnected to a live node and RabbitMQ elected a new
  leader. The node is restarted between runs;
- PostgreSQL failover, ``--failovers`` times: a private primary with a synchronous standby
  (tests/pg_servers.py), the workers and the relay on a DSN naming both
  (``target_session_attrs=read-write``), the primary stopped with ``pg_ctl stop -m
  immediate`` and the standby promoted at once, one order placed (retried until the new
  primary takes it, as a producer would), and the time from the kill to its first committed
  step: the pools dropped their dead connections and found the promoted standby.

Figures measured while other work runs on the machine are noisy: the load is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
import uuid
from typing import Any

import psycopg

from estafeta import DatabaseUnavailable, Runtime
from estafeta_actors.order_saga import place_order
from estafeta_cli.seed import plan_orders, seed_services
from tests.pg_servers import private_postgres
from tests.rabbit_servers import RabbitNode, private_rabbitmq_node, rabbitmq_cluster

from .common import describe, machine, scratch_database
from .relay_latency import latency
from .relay_setup import Services
from .sagas import _migrate, _wipe, measure_sagas, process_harness

#: Every step's inbox: the first commit after the kill is in one of them.
_FIRST_STEP = " UNION ALL ".join(
    f"SELECT processed_at FROM {service}.inbox WHERE processed_at > %(t)s"
    for service in ("orders", "payments", "inventory", "notifications")
)


def _leader(nodes: list[RabbitNode], queue: str) -> RabbitNode | None:
    for node in nodes:
        with contextlib.suppress(Exception):
            listed = json.loads(node.ctl("list_queues", "name", "leader", "--formatter", "json", timeout=30) or "[]")
            leader = next((q["leader"] for q in listed if q["name"] == queue), None)
            return next((n for n in nodes if n.node == leader), None)
    return None


def _measure(runtime: Runtime, dsn: str, sagas: int) -> dict[str, Any]:
    """Once the workers answer (one saga placed and ended), ``sagas`` placed at once, on emptied tables."""
    _wipe(dsn)
    measure_sagas(runtime, 1, dsn)
    _wipe(dsn)
    return measure_sagas(runtime, sagas, dsn)


def _first_step_after(dsn: str, since: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = f"SELECT min(processed_at) FROM ({_FIRST_STEP}) AS steps"
        deadline = time.monotonic() + 300
        while (first := (conn.execute(query, {"t": since}).fetchone() or [None])[0]) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no step committed within 300 s of the kill")
            time.sleep(0.02)
    return first


def failover(runtime: Runtime, nodes: list[RabbitNode]) -> float:
    """Kill the ``orders`` leader, place one order: seconds from the kill to its first committed step."""
    victim = _leader(nodes, "orders")
    assert victim is not None, "no leader for the orders queue"
    plan = plan_orders(1, prefix=f"f{uuid.uuid4().hex[:6]}-", rng=random.Random(3))
    seed_services(runtime, plan.balances, plan.stock)
    database = runtime.database("orders")
    with database.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    killed_at = row[0]
    victim.kill()
    customer, sku, quantity, amount = plan.orders[0]
    with database.transaction() as conn:
        place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
    seconds = (_first_step_after(runtime.settings.database_url, killed_at) - killed_at).total_seconds()
    victim.start()
    victim.wait()
    return float(seconds)


def pg_failover(broker_url: str, threads: int) -> float:
    """Crash a primary, promote its standby, place one order: seconds from the crash to its first committed step."""
    with private_postgres() as primary:
        standby = primary.standby(synchronous=True)
        dsn = (
            f"host={primary.host},{standby.host} port={primary.port},{standby.port} user=postgres"
            " dbname=postgres target_session_attrs=read-write connect_timeout=5"
        )
        _migrate(dsn)
        with process_harness(dsn, broker_url, 1, 4) as runtime:
            _measure(runtime, dsn, 1)  # the workers answer, and every pool holds live connections
            plan = plan_orders(1, prefix=f"p{uuid.uuid4().hex[:6]}-", rng=random.Random(5))
            seed_services(runtime, plan.balances, plan.stock)
            with psycopg.connect(primary.dsn(), autocommit=True) as conn:
                row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            killed_at = row[0]
            primary.stop("immediate")
            standby.promote()
            customer, sku, quantity, amount = plan.orders[0]
            deadline = time.monotonic() + 120
            while True:
                try:
                    with runtime.database("orders").transaction() as conn:
                        place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
                    break
                except DatabaseUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            first = _first_step_after(dsn, killed_at)
    return float((first - killed_at).total_seconds())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement."""
    results: dict[str, Any] = {"machine": machine()}
    with scratch_database(args.database_url, _migrate) as dsn:
        with private_rabbitmq_node() as node:
            with process_harness(dsn, node.url(), 1, args.threads) as runtime:
                results["one node, classic queues"] = _measure(runtime, dsn, args.sagas)
            results["one node, classic queues"]["publish"] = latency(
                Services(dsn, node.url(), ""), "rabbitmq", args.rate, args.seconds
            )
        with rabbitmq_cluster(3) as nodes:
            url = "amqp://guest:guest@" + ",".join(n.host for n in nodes) + "/%2F"
            quorum = {"ESTAFETA_RABBITMQ_QUEUE_TYPE": "quorum"}
            with process_harness(dsn, url, 1, args.threads, settings=quorum) as runtime:
                results["three nodes, quorum queues"] = _measure(runtime, dsn, args.sagas)
                times = [failover(runtime, nodes) for _ in range(args.failovers)]
                results["failover_seconds"] = times
            results["three nodes, quorum queues"]["publish"] = latency(
                Services(dsn, url, ""), "rabbitmq", args.rate, args.seconds, **quorum
            )
    with private_rabbitmq_node() as node:
        results["pg_failover_seconds"] = [pg_failover(node.url(), args.threads) for _ in range(args.failovers)]
    return results


def table(results: dict[str, Any]) -> str:
    """The figures, side by side."""
    lines = [f"machine: {describe(results['machine'])}", ""]
    lines.append(f"{'':28} {'sagas':>6} {'sagas/s':>8} {'p50 s':>7} {'p99 s':>7}   commit-to-publish p50, p99 ms")
    for name in ("one node, classic queues", "three nodes, quorum queues"):
        found = results[name]
        publish = found["publish"]
        lines.append(
            f"{name:28} {found['sagas']:>6} {found['sagas_per_second']:>8.1f}"
            f" {found['latency_p50']:>7.2f} {found['latency_p99']:>7.2f}"
            f"   {publish['p50_ms']:>8.1f} {publish['p99_ms']:>8.1f}"
        )
    lines.append("")
    for key, what in (
        ("failover_seconds", "RabbitMQ failover (SIGKILL of the orders leader -> first committed step)"),
        ("pg_failover_seconds", "PostgreSQL failover (primary stopped -m immediate, standby promoted -> first step)"),
    ):
        times = results[key]
        lines.append(
            f"{what}, {len(times)} runs:"
            f" min {min(times):.2f} s, median {statistics.median(times):.2f} s, max {max(times):.2f} s"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    found = argparse.ArgumentParser(prog="python -m bench.ha", description=__doc__.split("\n\n")[0])
    found.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "host=127.0.0.1 port=5432 user=postgres dbname=test"),
    )
    found.add_argument("--sagas", type=int, default=300, help="Sagas placed at once on each setup.")
    found.add_argument("--threads", type=int, default=8, help="Worker threads (one worker process).")
    found.add_argument("--failovers", type=int, default=5, help="Node kills and PostgreSQL failovers to time.")
    found.add_argument("--rate", type=float, default=50.0, help="Outbox rows a second for the publish latency.")
    found.add_argument("--seconds", type=float, default=10.0, help="How long the publish latency is measured.")
    found.add_argument("--json", action="store_true", help="Print the results as JSON.")
    return found


def main(argv: list[str] | None = None) -> None:
    """Run and print."""
    args = parser().parse_args(argv)
    results = run(args)
    print(json.dumps(results, default=str, indent=2) if args.json else table(results))


if __name__ == "__main__":
    main()
