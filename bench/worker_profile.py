"""Where a worker's CPU goes: py-spy samples of the order system's workers on ping/pongs (or order sagas), by package.

    python -m bench.worker_profile [--pings 3000 | --sagas 600 [--no-history]] [--handoffs 8] [--seconds 15] [--top 15]

On a scratch database and RabbitMQ vhost, one ``dramatiq estafeta_actors --processes 1 --threads 8``
and one ``estafeta relay`` run; pings are written in one transaction and py-spy samples the
worker process (threads waiting on a socket or a lock are idle and not sampled) while they
are answered (only the thread holding the GIL is sampled: Python-level CPU). Each sample is
charged to the innermost frame's package: where the time goes between estafeta's own code,
psycopg, pika, Dramatiq, JSON and the rest; ``--top`` also lists the functions with the
most samples, and the estafeta functions under which the most samples were taken. Shares of
CPU samples, so a busy machine changes the totals more than the split.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from estafeta import Runtime, Settings
from estafeta_actors.order_saga import place_order
from estafeta_actors.pingpong import SERVICE as pingpong_service
from estafeta_actors.pingpong import Ping
from estafeta_cli.seed import plan_orders, seed_services

from .common import describe, machine, rabbitmq_vhost, scratch_database, stop
from .sagas import _migrate, _wait, without_history

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

#: Innermost-frame path fragments (py-spy writes ``function (package/module.py:line)``), first match wins.
PACKAGES = [
    ("psycopg", "(psycopg"),
    ("pika", "(pika/"),
    ("dramatiq", "(dramatiq/"),
    ("json / cattrs / attrs", "(json/"),
    ("json / cattrs / attrs", "(cattrs/"),
    ("json / cattrs / attrs", "(attr/"),
    ("opentelemetry", "(opentelemetry/"),
    ("prometheus_client", "(prometheus_client/"),
    ("logging", "(logging/"),
    ("estafeta (estafeta/, sql/, brokers/, actors/)", "(estafeta/"),
    ("estafeta (estafeta/, sql/, brokers/, actors/)", "(sql/"),
    ("estafeta (estafeta/, sql/, brokers/, actors/)", "(brokers/"),
    ("estafeta (estafeta/, sql/, brokers/, actors/)", "(actors/"),
    ("threading, queue, selectors", "(threading.py"),
    ("threading, queue, selectors", "(queue.py"),
    ("threading, queue, selectors", "(selectors.py"),
]


def package(frame: str) -> str:
    """The package a collapsed-stack frame (``function (path:line)``) belongs to."""
    for name, fragment in PACKAGES:
        if fragment in frame:
            return name
    return "other (stdlib, uuid, contextlib...)"


def _stacks(collapsed: str) -> list[tuple[list[str], int]]:
    """py-spy's raw output as (frames, outermost first; samples)."""
    stacks = []
    for line in collapsed.splitlines():
        stack, _, number = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f.strip()]
        if frames and number.isdigit():
            stacks.append((frames, int(number)))
    return stacks


def top_functions(collapsed: str, count: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The innermost functions with the most samples, and estafeta's functions with the most samples under them."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, number in _stacks(collapsed):
        total += number
        own[_function(frames[-1])] += number
        for name in {_function(f) for f in frames if package(f).startswith("estafeta")}:
            under[name] += number
    total = total or 1
    return (
        [(name, n / total) for name, n in own.most_common(count)],
        [(name, n / total) for name, n in under.most_common(count)],
    )


def _function(frame: str) -> str:
    """``function (path/module.py:line)`` without the line, and the path cut to its last two parts."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


def shares(collapsed: str) -> dict[str, float]:
    """Each package's share of the samples in py-spy's raw (collapsed) output, by innermost frame."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed.splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = [f for f in stack.split(";") if f.strip()]
        counts[package(frames[-1])] += int(number)
    total = sum(counts.values()) or 1
    return {name: count / total for name, count in counts.most_common()}


def profile(
    database_url: str,
    amqp_url: str,
    pings: int,
    seconds: float,
    sagas: int = 0,
    handoffs: int = 0,
    history: bool = True,
) -> str:
    """Run the worker and the relay, answer ``pings`` ping/pongs (or run ``sagas`` order sagas) under py-spy.

    ``handoffs``: the worker's ``ESTAFETA_HANDOFFS``. ``history=False``: the order sagas
    without the order's history (``bench.sagas``'s ``ho-nohistory`` row). Returns py-spy's
    raw (collapsed) samples.
    """
    with scratch_database(database_url, _migrate) as dsn, rabbitmq_vhost(amqp_url) as amqp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
        env.update(ESTAFETA_DATABASE_URL=dsn, ESTAFETA_BROKER_URL=amqp, PYTHONPATH=str(ROOT))
        env.update(ESTAFETA_HANDOFFS=str(handoffs))
        module = "estafeta_actors" if history else "bench.actors_without_history"
        worker = subprocess.Popen(
            [str(BIN / "dramatiq"), module, "--processes", "1", "--threads", "8"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        relay = subprocess.Popen(
            [str(BIN / "estafeta"), "relay"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        runtime = Runtime(Settings(database_url=dsn))
        try:
            database = runtime.database("pingpong")
            with database.transaction() as conn:
                pingpong_service.send(conn, Ping(uuid.uuid4(), datetime.now(UTC)))
            with database.connection() as conn:
                _wait(conn, "SELECT count(*) FROM pingpong.pings WHERE ponged_at IS NOT NULL", 1, timeout=120)
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "worker.txt"
                spy = [str(BIN / "py-spy"), "record", "--subprocesses", "--format", "raw", "--rate", "200", "--gil"]
                sampler = subprocess.Popen(
                    [*spy, "--duration", str(int(seconds)), "--output", str(out), "--pid", str(worker.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(1)
                if sagas:
                    with contextlib.nullcontext() if history else without_history():
                        _place(runtime, sagas)
                else:
                    with database.transaction() as conn:
                        for _ in range(pings):
                            pingpong_service.send(conn, Ping(uuid.uuid4(), datetime.now(UTC)))
                sampler.wait(seconds + 60)
                raw = out.read_text()
                if os.environ.get("BENCH_PROFILE_RAW"):
                    Path(os.environ["BENCH_PROFILE_RAW"]).write_text(raw)
                return raw
        finally:
            stop((worker, relay))
            runtime.close()


def _place(runtime: Runtime, count: int) -> None:
    """``count`` order sagas of the demo's mix, placed in one transaction."""
    plan = plan_orders(count, prefix=f"p{uuid.uuid4().hex[:6]}-", rng=random.Random(7))
    seed_services(runtime, plan.balances, plan.stock)
    with runtime.database("orders").transaction() as conn:
        for customer, sku, quantity, amount in plan.orders:
            place_order(conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--pings", type=int, default=3000)
    parser.add_argument("--sagas", type=int, default=0, help="order sagas instead of ping/pongs (0: ping/pongs)")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--handoffs", type=int, default=0, help="ESTAFETA_HANDOFFS of the worker (default 0)")
    parser.add_argument(
        "--no-history",
        dest="history",
        action="store_false",
        help="order sagas without the order's history (as bench.sagas's ho-nohistory row)",
    )
    parser.add_argument("--top", type=int, default=0, help="also list this many functions (0: only packages)")
    default_database = "host=127.0.0.1 port=5432 user=postgres dbname=test"
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", default_database))
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    args = parser.parse_args()
    started = time.monotonic()
    raw = profile(args.database_url, args.amqp_url, args.pings, args.seconds, args.sagas, args.handoffs, args.history)
    workload = f"{args.sagas} order sagas" if args.sagas else f"{args.pings} ping/pongs"
    if args.sagas and not args.history:
        workload += " without the order's history"
    print(f"worker profile, {workload}: {describe(machine())}; {time.monotonic() - started:.0f} s")
    print("share of the worker's CPU samples, by the innermost frame's package:")
    for name, share in shares(raw).items():
        print(f"  {share:>6.1%}  {name}")
    if args.top:
        innermost, under = top_functions(raw, args.top)
        print("functions with the most samples (innermost frame):")
        for name, share in innermost:
            print(f"  {share:>6.1%}  {name}")
        print("estafeta functions with the most samples under them:")
        for name, share in under:
            print(f"  {share:>6.1%}  {name}")


if __name__ == "__main__":
    main()
