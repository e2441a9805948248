"""``python -m bench.http``: POST /orders with an Idempotency-Key beside the same endpoint without one.

One uvicorn process serves the order API (``bench.http_app``: ``estafeta serve``'s app
with the key optional) on a scratch database; an asyncio httpx client keeps
``--concurrency`` requests in flight. Rounds alternate the two kinds of request, so
both see the same machine: ``without keys`` is the order, its saga row and its first
command in one transaction (the baseline); ``with keys`` adds the key's lock, lookup,
record to that transaction. Figures: requests per second, p50 and p99 latency seen by
the client, and the CPU each request cost the server process and the PostgreSQL backends
serving it (read from /proc: it stays put when other work shares the cores, where req/s
does not). The overhead of the record is given by both; the budget is 20 %.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg

from estafeta import Runtime, Settings
from estafeta_actors.app import app as order_system

from .common import add_database_url, describe, machine, scratch_database
from .cpu import process_cpu

ROOT = Path(__file__).resolve().parents[1]
ORDER = {"customer_id": "c1", "sku": "s1", "quantity": 1, "amount_cents": 990}
MODES = ("without keys", "with keys")


def _migrate(dsn: str) -> None:
    runtime = Runtime(Settings(database_url=dsn))
    try:
        order_system.migrate(runtime)
    finally:
        runtime.close()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` (all their threads) so far; 0 for one that is gone."""
    return sum(process_cpu(pid) for pid in pids)


class Processes:
    """The server process and the PostgreSQL backends serving the scratch database."""

    def __init__(self, server_pid: int, dsn: str) -> None:
        self.server_pid = server_pid
        self.monitor = psycopg.connect(dsn, autocommit=True)

    def backend_pids(self) -> list[int]:
        """The backends connected to the scratch database now (the server's pool), this monitor's aside."""
        rows = self.monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return [int(r[0]) for r in rows]

    def close(self) -> None:
        """Close the monitoring connection."""
        self.monitor.close()


@contextlib.contextmanager
def serving(dsn: str) -> Iterator[tuple[str, int]]:
    """uvicorn serving ``bench.http_app`` on ``dsn``; yields its URL and pid."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
    env.update(ESTAFETA_DATABASE_URL=dsn, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "uvicorn", "--factory", "bench.http_app:create", "--port", str(port)]
    server = subprocess.Popen([*argv, "--no-access-log", "--log-level", "warning"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the benchmark's server did not start")
            time.sleep(0.2)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _measured(url: str, mode: str, args: argparse.Namespace, processes: Processes) -> dict[str, Any]:
    server, backends = processes.server_pid, processes.backend_pids()
    before = _cpu_seconds([server]), _cpu_seconds(backends)
    phase = asyncio.run(_phase(url, mode, args.requests, args.concurrency))
    phase["server_cpu_seconds"] = _cpu_seconds([server]) - before[0]
    phase["database_cpu_seconds"] = _cpu_seconds(processes.backend_pids()) - before[1]
    return phase


async def _phase(url: str, mode: str, requests: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    remaining = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        for _ in remaining:
            headers = {"Idempotency-Key": str(uuid.uuid4())} if mode == "with keys" else {}
            started = time.perf_counter()
            answer = await client.post("/orders", json=ORDER, headers=headers)
            latencies.append(time.perf_counter() - started)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"mode": mode, "requests": requests, "seconds": seconds, "latencies": latencies, "statuses": statuses}


def _summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = sorted(x for p in phases for x in p["latencies"])
    requests = sum(p["requests"] for p in phases)
    statuses: dict[str, int] = {}
    for phase in phases:
        for status, count in phase["statuses"].items():
            statuses[str(status)] = statuses.get(str(status), 0) + count
    return {
        "requests": requests,
        "requests_per_s": requests / sum(p["seconds"] for p in phases),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "server_cpu_ms_per_request": 1000 * sum(p.get("server_cpu_seconds", 0.0) for p in phases) / requests,
        "database_cpu_ms_per_request": 1000 * sum(p.get("database_cpu_seconds", 0.0) for p in phases) / requests,
        "statuses": statuses,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then ``args.rounds`` rounds of each mode, alternating which goes first."""
    with scratch_database(args.database_url, _migrate) as dsn, serving(dsn) as (url, pid):
        processes = Processes(pid, dsn)
        for mode in MODES:  # warm-up (connections, prepared statements), not counted
            asyncio.run(_phase(url, mode, args.requests // 4, args.concurrency))
        phases: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                phases[mode].append(_measured(url, mode, args, processes))
        processes.close()
        with psycopg.connect(dsn) as conn:
            stored = conn.execute("SELECT count(*) FROM orders.orders").fetchone()
            records = conn.execute("SELECT count(*) FROM orders.idempotency_keys").fetchone()
    results = {mode: _summary(found) for mode, found in phases.items()}
    base, keyed = results["without keys"]["requests_per_s"], results["with keys"]["requests_per_s"]
    for found in results.values():
        found["cpu_ms_per_request"] = found["server_cpu_ms_per_request"] + found["database_cpu_ms_per_request"]
    base_cpu, keyed_cpu = (results[m]["cpu_ms_per_request"] for m in MODES)
    return {
        "results": results,
        "overhead_percent": 100 * (base - keyed) / base,
        "cpu_overhead_percent": 100 * (keyed_cpu - base_cpu) / base_cpu,
        "orders_stored": stored[0] if stored else 0,
        "idempotency_records": records[0] if records else 0,
        "concurrency": args.concurrency,
        "machine": machine(),
    }


def table(report: dict[str, Any]) -> str:
    """The figures, the baseline first."""
    header = (
        f"{'POST /orders':<16}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'CPU ms/req: server':>20}{'+ PostgreSQL':>14}{'= total':>9}  statuses"
    )
    lines = [header, "-" * len(header)]
    for mode in MODES:
        r = report["results"][mode]
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(r["statuses"].items()))
        line = (
            f"{mode:<16}{r['requests']:>10}{r['requests_per_s']:>9.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{r['server_cpu_ms_per_request']:>20.2f}{r['database_cpu_ms_per_request']:>14.2f}"
            f"{r['cpu_ms_per_request']:>9.2f}"
        )
        lines.append(f"{line}  {statuses}")
    lines.append(
        f"\nidempotency record overhead: {report['overhead_percent']:.1f} % of the baseline's req/s"
        f" ({_verdict(report['overhead_percent'])}), {report['cpu_overhead_percent']:.1f} % more CPU per request"
        f" ({_verdict(report['cpu_overhead_percent'])}); orders stored {report['orders_stored']},"
        f" records {report['idempotency_records']}"
    )
    lines.append(f"{report['concurrency']} requests in flight, one uvicorn process; {describe(report['machine'])}")
    return "\n".join(lines)


def _verdict(percent: float) -> str:
    return "within the 20 % budget" if percent <= 20 else "OVER the 20 % budget"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per mode and round (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode (default 3)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_database_url(parser)
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(table(report))


if __name__ == "__main__":
    main()
