"""``python -m bench.sagas``: order-saga throughput per broker, beside the raw step throughput.

On a scratch PostgreSQL database, for each broker (the StubBroker with an in-process
worker and relay; RabbitMQ and Redis, when reachable, and Kafka (``BENCH_KAFKA_URL``, or a
Tansu the benchmark starts), with ``dramatiq estafeta_actors`` worker processes and an
``estafeta relay`` process):

- ``baseline``: ping/pong round trips (two one-transaction steps, no saga): step messages
  per second, the ceiling the same worker, relay and database reach;
- ``sagas``: order sagas (a mix that completes and compensates, as in the demo): sagas
  per second, the step messages per second they cost (orchestrator replies included),
  and latency p50/p99 from placing to the end.

and, in the same run, the peers (bench/peers.py): procrastinate's and pgqueuer's workers
doing a one-row write per job on the same database server, and a bare Dramatiq actor on
the same RabbitMQ, with estafeta's step rate printed as a multiple of each; and DBOS
Transact running the order saga as a durable workflow on the same tables (bench/peer_dbos.py),
in as many processes as estafeta has workers and in one, beside estafeta's sagas.

Work is placed in one transaction once the workers answer, and timed with the database's
own timestamps, so process start-up is not counted. Figures measured while other work
runs on the machine are noisy: say so when you quote them. ``--rounds N`` measures every
broker and DBOS N times, in turn (every other round in the reverse order), and prints the
median round with every round's figures: on a shared two-core machine one round per broker
is not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import dramatiq
import psycopg
from dramatiq.brokers.stub import StubBroker
from psycopg import sql

from estafeta import Runtime, Settings, build_relay
from estafeta_actors.app import app
from estafeta_actors.order_history import record_transition
from estafeta_actors.order_saga import ORDER_SAGA, place_order
from estafeta_actors.pingpong import SERVICE as pingpong_service
from estafeta_actors.pingpong import Ping
from estafeta_cli.seed import plan_orders, seed_services

from . import cpu, peers
from .common import (
    add_database_url,
    describe,
    machine,
    rabbitmq_vhost,
    reachable,
    redis_namespace,
    scratch_database,
    stop,
)
from .pg_activity import DatabaseWatch, database_line

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _migrate(dsn: str) -> None:
    runtime = Runtime(Settings(database_url=dsn))
    app.migrate(runtime)
    runtime.close()


def _wipe(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables"
            " WHERE schemaname = ANY(%s) AND tablename <> 'schema_migrations'",
            (app.service_names,),
        ).fetchall()
        tables = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in names)
        conn.execute(sql.SQL("TRUNCATE {}").format(tables))


@contextlib.contextmanager
def stub_harness(dsn: str) -> Iterator[Runtime]:
    """A StubBroker with a worker (8 threads) and the relay in this process."""
    runtime = Runtime(Settings(database_url=dsn, pool_size=12))
    broker = StubBroker()
    broker.emit_after("process_boot")
    app.bind(broker, runtime)
    worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)
    relay = build_relay(runtime, broker, app.service_names, poll_interval=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    worker.start()
    thread.start()
    try:
        yield runtime
    finally:
        stop.set()
        thread.join(10)
        worker.stop()
        broker.close()
        runtime.close()


@contextlib.contextmanager
def process_harness(
    dsn: str,
    broker_url: str,
    processes: int,
    threads: int = 8,
    lanes: int = 2,
    settings: Mapping[str, str] = {},
    module: str = "estafeta_actors",
) -> Iterator[Runtime]:
    """``dramatiq estafeta_actors`` (``processes`` x ``threads``) and ``estafeta relay`` processes.

    ``settings``: more ``ESTAFETA_*`` variables for them. ``module``: the workers' module.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
    env.update(ESTAFETA_DATABASE_URL=dsn, ESTAFETA_BROKER_URL=broker_url, ESTAFETA_RELAY_POLL_INTERVAL="0.05")
    env.update(settings)
    env["PYTHONPATH"] = str(ROOT)
    argv = [str(BIN / "dramatiq"), module, "--processes", str(processes), "--threads", str(threads)]
    children = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cmd in (argv, [str(BIN / "estafeta"), "relay", "--lanes", str(lanes)])
    ]
    runtime = Runtime(Settings(database_url=dsn))
    try:
        yield runtime
    finally:
        stop(children)
        runtime.close()


def _wait(conn: psycopg.Connection[Any], query: str, expected: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while (conn.execute(query).fetchone() or [0])[0] < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {expected} from: {query}")
        time.sleep(0.05)


def _inbox_rows(conn: psycopg.Connection[Any]) -> int:
    return sum(
        int(
            (conn.execute(sql.SQL("SELECT count(*) FROM {}.inbox").format(sql.Identifier(s.name))).fetchone() or [0])[0]
        )
        for s in app.services
    )


def measure_pings(runtime: Runtime, count: int) -> dict[str, Any]:
    """Ping/pong round trips: step messages per second."""
    database = runtime.database("pingpong")
    with database.transaction() as conn:
        conn.execute("DELETE FROM pingpong.pings")
        for _ in range(count):
            pingpong_service.send(conn, Ping(uuid.uuid4(), datetime.now(UTC)))
    with database.connection() as conn:
        _wait(conn, "SELECT count(*) FROM pingpong.pings WHERE ponged_at IS NOT NULL", count)
        row = conn.execute("SELECT extract(epoch FROM max(ponged_at) - min(sent_at)) FROM pingpong.pings").fetchone()
    seconds = float(row[0]) if row and row[0] else float("nan")
    return {"round_trips": count, "seconds": seconds, "step_messages_per_second": 2 * count / seconds}


def measure_sagas(runtime: Runtime, count: int, dsn: str) -> dict[str, Any]:
    """Order sagas placed at once: sagas and step messages per second, latency, machine and database use per step."""
    plan = plan_orders(count, prefix=f"b{uuid.uuid4().hex[:6]}-", rng=random.Random(7))
    seed_services(runtime, plan.balances, plan.stock)
    with runtime.database("orders").connection() as conn:
        before = _inbox_rows(conn)
    watch = DatabaseWatch(dsn).start()
    busy, by_group = cpu.busy_seconds(), cpu.cpu_by_process_group()
    with runtime.database("orders").transaction() as conn:
        for customer, sku, quantity, amount in plan.orders:
            place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
    with runtime.database("orders").connection() as conn:
        _wait(conn, "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL", count)
        busy = cpu.busy_seconds() - busy
        after = cpu.cpu_by_process_group()
        row = conn.execute(
            """SELECT extract(epoch FROM max(completed_at) - min(started_at)),
                      percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)),
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)),
                      count(*) FILTER (WHERE status = 'completed')
               FROM orders.saga_order"""
        ).fetchone()
        messages = _inbox_rows(conn) - before
    database = watch.stop(messages)
    assert row is not None
    seconds = float(row[0])
    return {
        "sagas": count,
        "completed": int(row[3]),
        "seconds": seconds,
        "sagas_per_second": count / seconds,
        "step_messages_per_second": messages / seconds,
        "messages_per_saga": messages / count,
        "latency_p50": float(row[1]),
        "latency_p99": float(row[2]),
        # Everything the machine did while the sagas ran (other work too, on a busy machine).
        "cpu_ms_per_step": 1000 * busy / messages if messages else float("nan"),
        "cpu_ms_per_saga": 1000 * busy / count,
        "cpu_ms_per_step_by_process": {
            group: 1000 * (after[group] - by_group.get(group, 0.0)) / messages
            for group in sorted(after, key=lambda g: by_group.get(g, 0.0) - after[g])
            if messages and after[group] - by_group.get(group, 0.0) > 0
        },
        "database_per_step": database,
    }


def measure_steady(runtime: Runtime, rate: float, seconds: float, placers: int = 4) -> dict[str, Any]:
    """Order sagas placed steadily, ``rate`` a second (each in its own transaction) for ``seconds``: latency.

    ``placers`` threads share the schedule (order ``n`` is due ``n / rate`` seconds after
    the start), so one slow commit does not hold the next placements back.
    """
    count = max(1, int(rate * seconds))
    plan = plan_orders(count, prefix=f"s{uuid.uuid4().hex[:6]}-", rng=random.Random(11))
    seed_services(runtime, plan.balances, plan.stock)
    database = runtime.database("orders")
    with database.connection() as conn:
        ended_before = int((conn.execute("SELECT count(*) FROM orders.saga_order").fetchone() or [0])[0])
    placed: list[uuid.UUID] = []
    started = time.monotonic()

    def place(first: int) -> None:
        for n in range(first, count, placers):
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
            customer, sku, quantity, amount = plan.orders[n]
            with database.transaction() as conn:
                order = place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)
            placed.append(order.saga_id)

    threads = [threading.Thread(target=place, args=(i,)) for i in range(placers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    placing = time.monotonic() - started
    with database.connection() as conn:
        _wait(conn, "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL", ended_before + count)
        row = conn.execute(
            """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)),
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)),
                      max(extract(epoch FROM completed_at - started_at))
               FROM orders.saga_order WHERE saga_id = ANY(%s)""",
            (placed,),
        ).fetchone()
    assert row is not None
    return {
        "rate": rate,
        "placed_per_second": count / placing,
        "sagas": count,
        "latency_p50": float(row[0]),
        "latency_p99": float(row[1]),
        "latency_max": float(row[2]),
    }


#: The row of the RabbitMQ run whose steps hand off (``--handoffs``, ``ESTAFETA_HANDOFFS``).
HANDOFFS = "rabbitmq-ho"
#: The row of the RabbitMQ run (with hand-offs, unless ``--handoffs 0``) without the order's
#: history: DBOS's workload (``bench/actors_without_history.py``).
NO_HISTORY = "ho-nohistory"
#: The row of the RabbitMQ run whose order saga runs the orders service's own steps locally
#: (``Saga(local_steps=True)``, ``bench/actors_local_steps.py``); no hand-offs, with the history.
LOCAL_STEPS = "rabbitmq-local"
#: The ``ho-nohistory`` row with local steps too (``bench/actors_local_without_history.py``).
LOCAL_NO_HISTORY = "ho-local-nohistory"


@contextlib.contextmanager
def without_history() -> Iterator[None]:
    """This process places orders without the order saga's history hook (and gets it back after).

    Its workers must run without it too: ``dramatiq bench.actors_without_history``.
    """
    ORDER_SAGA.on_transition = None
    try:
        yield
    finally:
        ORDER_SAGA.on_transition = record_transition


@contextlib.contextmanager
def no_history_harness(
    dsn: str,
    broker_url: str,
    processes: int,
    threads: int,
    lanes: int,
    settings: Mapping[str, str],
    module: str = "bench.actors_without_history",
) -> Iterator[Runtime]:
    """:func:`process_harness` without the order's history (the ``ho-nohistory`` row; ``module``: its workers')."""
    with without_history(), process_harness(dsn, broker_url, processes, threads, lanes, settings, module) as runtime:
        yield runtime


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, by broker."""
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as run_resources:
        dsn = run_resources.enter_context(scratch_database(args.database_url, _migrate))
        harnesses: list[tuple[str, Any]] = [("stub", lambda: stub_harness(dsn))]
        wakeup = {"ESTAFETA_WAKEUP": args.wakeup} if args.wakeup else {}
        shape = (args.processes, args.threads, args.lanes, wakeup)
        amqp: str | None = None
        if reachable(args.amqp_url, 5672):
            amqp = run_resources.enter_context(rabbitmq_vhost(args.amqp_url))
            harnesses.append(("rabbitmq", lambda: process_harness(dsn, amqp, *shape)))
            handing = (*shape[:3], {**wakeup, "ESTAFETA_HANDOFFS": str(args.handoffs)})
            if args.handoffs:
                harnesses.append((HANDOFFS, lambda: process_harness(dsn, amqp, *handing)))
            harnesses.append((NO_HISTORY, lambda: no_history_harness(dsn, amqp, *handing)))
            local = (*shape, "bench.actors_local_steps")
            harnesses.append((LOCAL_STEPS, lambda: process_harness(dsn, amqp, *local)))
            local_nohistory = (*handing, "bench.actors_local_without_history")
            harnesses.append((LOCAL_NO_HISTORY, lambda: no_history_harness(dsn, amqp, *local_nohistory)))
        if reachable(args.redis_url, 6379):
            redis_url = run_resources.enter_context(redis_namespace(args.redis_url))
            harnesses.append(("redis", lambda: process_harness(dsn, redis_url, *shape)))
        kafka_url = _kafka(run_resources)
        if kafka_url:
            harnesses.append(("kafka", lambda: process_harness(dsn, kafka_url, *shape)))
        rounds: dict[str, list[dict[str, Any]]] = {}
        dbos_rounds: list[dict[str, Any]] = []
        # Each round measures every broker and DBOS in turn, every other round backwards: a
        # drift of the machine's speed during the run falls on all of them alike, and the
        # median round is reported.
        measured = [(name, harness) for name, harness in harnesses if not args.brokers or name in args.brokers]
        if args.peers:
            measured.append((DBOS, None))
        for number in range(args.rounds):
            for name, harness in round_order(measured, number):
                if harness is None:
                    dbos_rounds.append(_dbos(args, dsn))
                    continue
                _wipe(dsn)
                with harness() as runtime:
                    measure_pings(runtime, 20)  # warm-up: the workers answer
                    found = {
                        "baseline": measure_pings(runtime, args.pings),
                        "sagas": measure_sagas(runtime, args.orders, dsn),
                    }
                    if args.steady_rate > 0:
                        found["steady"] = measure_steady(runtime, args.steady_rate, args.steady_seconds)
                rounds.setdefault(name, []).append(found)
        for name, found_in_rounds in rounds.items():
            results[name] = median_round(
                found_in_rounds, lambda r: r["sagas"]["sagas_per_second"], lambda r: r["sagas"]["cpu_ms_per_step"]
            )
        if args.peers:
            results["peers"] = _peers(args, dsn, amqp)
            results["dbos"] = {
                shape: median_round(
                    [r[shape] for r in dbos_rounds], lambda r: r["sagas_per_second"], lambda r: r["cpu_ms_per_saga"]
                )
                for shape in (dbos_rounds[0] if dbos_rounds else {})
            }
    return results


#: DBOS's place among the variants a round measures (:func:`round_order`).
DBOS = "dbos"

T = TypeVar("T")


def round_order(variants: list[T], number: int) -> list[T]:
    """The order round ``number`` (from 0) measures ``variants`` in: as given, every other round backwards.

    A machine that speeds up or slows down through a run (a shared host) would otherwise
    favour whichever variant each round measures first.
    """
    return list(variants) if number % 2 == 0 else list(reversed(variants))


def median_round(
    found: list[dict[str, Any]], rate: Callable[[dict[str, Any]], float], cpu_ms: Callable[[dict[str, Any]], float]
) -> dict[str, Any]:
    """The round with the median ``rate`` (the lower middle of an even number), and every round's rate and CPU.

    ``rounds`` lists ``[rate, cpu_ms]`` of each round, in the order they ran.
    """
    ordered = sorted(found, key=rate)
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["rounds"] = [[rate(r), cpu_ms(r)] for r in found]
    return median


def _rounds_line(label: str, rounds: list[list[float]], cpu_label: str) -> str:
    rates = ", ".join(f"{rate:.1f}" for rate, _ in rounds)
    cpu = ", ".join(f"{ms:.2f}" for _, ms in rounds)
    return f"{label}{len(rounds)} rounds, in the order run: sagas/s {rates}; {cpu_label} {cpu} (shown: the median)"


def _kafka(resources: contextlib.ExitStack) -> str | None:
    """A ``kafka://`` URL with topics of the run's own, or ``None`` without the ``bench`` extra."""
    try:
        from .relay_kafka import kafka_server
    except ImportError as exc:
        print(f"bench.sagas: no Kafka figures ({exc}; pip install -e '.[bench]')", file=sys.stderr)
        return None
    url, _server = resources.enter_context(kafka_server())
    return url


def _peers(args: argparse.Namespace, dsn: str, amqp: str | None) -> dict[str, Any]:
    found = {"procrastinate": peers.procrastinate_rate(dsn, args.peer_jobs)}
    try:
        found["pgqueuer"] = peers.pgqueuer_rate(dsn, args.peer_jobs)
    except ImportError as exc:
        print(f"bench.sagas: no pgqueuer figures ({exc}; pip install -e '.[bench]')", file=sys.stderr)
    if amqp is not None and reachable(args.redis_url, 6379):
        found["dramatiq"] = peers.dramatiq_rate(amqp, args.redis_url, args.peer_messages, args.processes)
    return found


def _dbos(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    """The order saga on DBOS: in as many processes as estafeta has workers, then in one."""
    try:
        from .peer_dbos import dbos_sagas
    except ImportError as exc:
        print(f"bench.sagas: no DBOS figures ({exc}; pip install -e '.[bench]')", file=sys.stderr)
        return {}
    runtime = Runtime(Settings(database_url=dsn))
    try:
        shapes = sorted({args.processes, 1}, reverse=True)
        return dbos_sagas(args.database_url, dsn, runtime, args.orders, shapes, args.threads)
    finally:
        runtime.close()


def table(results: dict[str, Any], processes: int, threads: int) -> str:
    """The figures, one broker per line, the baseline beside the sagas."""
    brokers = {name: r for name, r in results.items() if name not in ("peers", "dbos")}
    width = max([12, *(len(name) + 2 for name in brokers)])  # the names, and a gap after them
    lines = [
        f"estafeta saga benchmark: {describe(machine())}",
        f"real brokers: dramatiq estafeta_actors --processes {processes} --threads {threads}",
        f"{'broker':<{width}}{'baseline: steps/s':>19}{'sagas/s':>10}{'saga steps/s':>14}{'steps/saga':>12}"
        f"{'vs baseline':>13}{'p50 s':>8}{'p99 s':>8}{'CPU ms/step':>13}",
    ]
    for name, r in brokers.items():
        base, sagas = r["baseline"]["step_messages_per_second"], r["sagas"]
        lines.append(
            f"{name:<{width}}{base:>19.0f}{sagas['sagas_per_second']:>10.1f}{sagas['step_messages_per_second']:>14.0f}"
            f"{sagas['messages_per_saga']:>12.1f}{sagas['step_messages_per_second'] / base:>12.0%}"
            f"{sagas['latency_p50']:>8.2f}{sagas['latency_p99']:>8.2f}{sagas['cpu_ms_per_step']:>13.2f}"
        )
    for name, r in brokers.items():
        if len(r.get("rounds", [])) > 1:
            lines.append(_rounds_line(f"{name:<{width}}", r["rounds"], "CPU ms/step"))
    for name, r in brokers.items():
        split = ", ".join(f"{group} {ms:.2f}" for group, ms in r["sagas"]["cpu_ms_per_step_by_process"].items())
        lines.append(f"{name:<{width}}CPU ms per saga step by process: {split}")
        lines.append(f"{name:<{width}}{database_line(r['sagas']['database_per_step'])}")
    steady = {name: r["steady"] for name, r in brokers.items() if "steady" in r}
    for name, r in steady.items():
        lines.append(
            f"{name:<{width}}steady {r['rate']:g} sagas/s placed (reached {r['placed_per_second']:.0f}/s,"
            f" {r['sagas']} sagas): p50 {r['latency_p50']:.2f} s, p99 {r['latency_p99']:.2f} s,"
            f" max {r['latency_max']:.2f} s"
        )
    return "\n".join(
        lines + _peer_lines(brokers, results.get("peers", {})) + _saga_peer_lines(brokers, results.get("dbos", {}))
    )


def _peer_lines(brokers: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Each peer's rate, and each broker's ping/pong step rate as a multiple of it."""
    lines = []
    labels = {
        "procrastinate": "procrastinate worker (--concurrency 8), one-row write per job",
        "dramatiq": "bare Dramatiq actor on RabbitMQ, same processes and threads",
        "pgqueuer": "pgqueuer worker (asyncpg, 8 writes at once), one-row write per job",
    }
    for peer, figures in found.items():
        rate = figures["per_second"]
        multiples = ", ".join(
            f"{name} {r['baseline']['step_messages_per_second'] / rate:.2f}x" for name, r in brokers.items()
        )
        target = " (target: 1.20x)" if peer == "pgqueuer" else ""
        lines.append(f"peer: {labels[peer]}: {rate:,.0f}/s; estafeta steps = {multiples}{target}")
    return lines


def _saga_peer_lines(brokers: dict[str, Any], dbos: dict[str, Any]) -> list[str]:
    """The order saga on estafeta (each broker) and on DBOS (each number of processes), side by side."""
    if not dbos:
        return []
    lines = [
        f"order saga, {next(iter(dbos.values()))['sagas']} placed at once:"
        f"{'sagas/s':>10}{'p50 s':>8}{'p99 s':>8}{'CPU ms/saga':>13}{'completed':>11}"
    ]
    rows = [(f"estafeta, {name}", r["sagas"]) for name, r in brokers.items()]
    rows += [(f"DBOS, {shape} process{'es' if shape != '1' else ''}", r) for shape, r in dbos.items()]
    for label, r in rows:
        lines.append(
            f"  {label:<32}{r['sagas_per_second']:>10.1f}{r['latency_p50']:>8.2f}{r['latency_p99']:>8.2f}"
            f"{r['cpu_ms_per_saga']:>13.1f}{r['completed']:>11}"
        )
    same = next(iter(dbos.values()))
    multiples = ", ".join(
        f"{name} {r['sagas']['sagas_per_second'] / same['sagas_per_second']:.2f}x" for name, r in brokers.items()
    )
    lines.append(f"  estafeta sagas/s = {multiples} DBOS's in {same['processes']} processes (as its workers)")
    for shape, r in dbos.items():
        if len(r.get("rounds", [])) > 1:
            lines.append(_rounds_line(f"  DBOS, {shape}: ", r["rounds"], "CPU ms/saga"))
    for shape, r in dbos.items():
        split = ", ".join(f"{group} {ms:.1f}" for group, ms in r["cpu_ms_per_saga_by_process"].items())
        lines.append(f"  DBOS, {shape}: CPU ms per saga by process: {split}")
    return lines


def parser() -> argparse.ArgumentParser:
    """The benchmark's options (``bench.worker_shape`` runs it with its own)."""
    parser = argparse.ArgumentParser(prog="python -m bench.sagas", description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=500, help="sagas per broker (default 500)")
    parser.add_argument("--pings", type=int, default=1000, help="ping/pong round trips per broker (default 1000)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes on real brokers (default 2)")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker process (default 8)")
    parser.add_argument("--lanes", type=int, default=2, help="the relay's lanes on real brokers (default 2, its own)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every broker and DBOS this many times, in turn (every other round backwards),"
        " and show the median round beside every round's sagas/s and CPU (default 1)",
    )
    parser.add_argument("--wakeup", choices=["notify", "after-commit", "poll"], help="ESTAFETA_WAKEUP of the workers")
    parser.add_argument(
        "--handoffs",
        type=int,
        default=8,
        help=f"ESTAFETA_HANDOFFS of a second RabbitMQ run, the '{HANDOFFS}' row (default 8; 0: no such run)",
    )
    parser.add_argument(
        "--steady-rate", type=float, default=100, help="sagas/s placed steadily for the latency figure (0: skip)"
    )
    parser.add_argument("--steady-seconds", type=float, default=10, help="how long to place them (default 10)")
    parser.add_argument(
        "--broker",
        dest="brokers",
        action="append",
        choices=["stub", "rabbitmq", HANDOFFS, NO_HISTORY, LOCAL_STEPS, LOCAL_NO_HISTORY, "redis", "kafka"],
        help="only this broker (repeatable; default: every reachable one)",
    )
    parser.add_argument(
        "--no-peers", dest="peers", action="store_false", help="skip procrastinate, pgqueuer, bare Dramatiq and DBOS"
    )
    parser.add_argument("--peer-jobs", type=int, default=5000, help="procrastinate and pgqueuer jobs (default 5000)")
    parser.add_argument("--peer-messages", type=int, default=20000, help="bare Dramatiq messages (default 20000)")
    add_database_url(parser)
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7"))
    return parser


def main(argv: list[str] | None = None) -> None:
    options = parser()
    args = options.parse_args(argv)
    if args.rounds < 1:
        options.error(f"--rounds must be at least 1, not {args.rounds}")
    results = run(args)
    if args.json:
        shape = {"processes": args.processes, "threads": args.threads}
        json.dump({"machine": machine(), **shape, "results": results}, sys.stdout, indent=2)
        print()
    else:
        print(table(results, args.processes, args.threads))


if __name__ == "__main__":
    main()
