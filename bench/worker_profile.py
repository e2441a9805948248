"""Where a worker's CPU goes: py-spy samples of ``dramatiq actors`` answering ping/pongs, by package.

    python -m bench.worker_profile [--pings 3000] [--seconds 15]

On a scratch database and RabbitMQ vhost, one ``dramatiq actors --processes 1 --threads 8``
and one ``estafeta relay`` run; pings are written in one transaction and py-spy samples the
worker process (threads waiting on a socket or a lock are idle and not sampled) while they
are answered (only the thread holding the GIL is sampled: Python-level CPU). Each sample is
charged to the innermost frame's package: where the time goes between estafeta's own code,
psycopg, pika, Dramatiq, JSON and the rest. Shares of CPU samples, so a busy machine changes
the totals more than the split.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from actors.pingpong import SERVICE as pingpong_service
from actors.pingpong import Ping
from estafeta import Runtime, Settings

from .common import describe, machine, rabbitmq_vhost, scratch_database
from .sagas import _migrate, _wait

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


def profile(database_url: str, amqp_url: str, pings: int, seconds: float) -> dict[str, float]:
    """Run the worker and the relay, answer ``pings`` ping/pongs under py-spy; the shares by package."""
    with scratch_database(database_url, _migrate) as dsn, rabbitmq_vhost(amqp_url) as amqp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
        env.update(ESTAFETA_DATABASE_URL=dsn, ESTAFETA_BROKER_URL=amqp, PYTHONPATH=str(ROOT))
        worker = subprocess.Popen(
            [str(BIN / "dramatiq"), "actors", "--processes", "1", "--threads", "8"],
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
                with database.transaction() as conn:
                    for _ in range(pings):
                        pingpong_service.send(conn, Ping(uuid.uuid4(), datetime.now(UTC)))
                sampler.wait(seconds + 60)
                raw = out.read_text()
                if os.environ.get("BENCH_PROFILE_RAW"):
                    Path(os.environ["BENCH_PROFILE_RAW"]).write_text(raw)
                return shares(raw)
        finally:
            for child in (worker, relay):
                child.terminate()
            for child in (worker, relay):
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
            runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--pings", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=15)
    default_database = "host=127.0.0.1 port=5432 user=postgres dbname=test"
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", default_database))
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    args = parser.parse_args()
    started = time.monotonic()
    found = profile(args.database_url, args.amqp_url, args.pings, args.seconds)
    print(f"worker profile: {describe(machine())}; {time.monotonic() - started:.0f} s")
    print("share of the worker's CPU samples, by the innermost frame's package:")
    for name, share in found.items():
        print(f"  {share:>6.1%}  {name}")


if __name__ == "__main__":
    main()
