"""``python -m bench.relay_rabbit``: ``estafeta relay`` to RabbitMQ beside raw pika, alternated, in one run.

The full ``bench.relay`` measures every broker once; this one measures only the relay's
rows/s over raw pika's (publishing the same rows in batches of 100 with confirms),
alternating the two ``--rounds`` times so the machine's noise falls
on both, with the relay process's CPU per row (``/proc``) and, with ``--profile FILE``,
py-spy's samples of the relay (raw, collapsed) for the first round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import psycopg

from . import relay_baselines as baselines
from .common import admin_dsn, rabbitmq_vhost, scratch_database
from .cpu import busy_seconds, cpu_by_process_group, process_cpu
from .relay import _check_delivered
from .relay_setup import AMQP_URL, BIN, Services, _migrate, fill, relays, wait_empty, warm_up


def relay_round(found: Services, rows: int, profile: str | None, *args: str) -> tuple[float, float]:
    """(rows/s, relay CPU ms per row) for one relay process draining ``rows`` committed rows."""
    queue = "bench_drain_rabbitmq"
    with relays(found.env(found.amqp_url), 1, *args) as started, psycopg.connect(found.dsn, autocommit=True) as conn:
        warm_up(conn, queue)
        pid = started[0].popen.pid
        spy = None
        if profile:
            spy_args = ["record", "--pid", str(pid), "--format", "raw", "--rate", "250", "--gil", "-o", profile]
            spy = subprocess.Popen(
                [str(BIN / "py-spy"), *spy_args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        with conn.transaction():
            fill(conn, rows, queue)
        cpu_before, busy_before, groups_before = process_cpu(pid), busy_seconds(), cpu_by_process_group()
        began = time.perf_counter()
        ended = wait_empty(conn)
        cpu_ms = (process_cpu(pid) - cpu_before) * 1000 / rows
        busy = (busy_seconds() - busy_before) / (ended - began)
        groups = {k: (v - groups_before.get(k, 0.0)) * 1000 / rows for k, v in cpu_by_process_group().items()}
        print(
            f"  machine busy {busy:.2f} of 2 cores; CPU ms/row: "
            + ", ".join(f"{k} {v:.3f}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v > 0.002)
        )
        if spy:
            spy.send_signal(2)
            spy.wait(30)
    _check_delivered(found.amqp_url, "rabbitmq", queue, rows + 1)
    return rows / (ended - began), cpu_ms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_rabbit", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows per drain (default 20,000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of relay and raw pika (default 3)")
    parser.add_argument("--profile", help="write py-spy's raw samples of the relay's first round here")
    parser.add_argument("--lanes", type=int, default=None, help="the relay's --lanes (default: its own)")
    args = parser.parse_args(argv)
    extra = ("--lanes", str(args.lanes)) if args.lanes else ()
    with scratch_database(admin_dsn(), _migrate) as dsn, rabbitmq_vhost(AMQP_URL) as amqp_url:
        found = Services(dsn, amqp_url, "")
        print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.rows:,} rows per drain")
        ratios = []
        for n in range(args.rounds):
            rate, cpu_ms = relay_round(found, args.rows, args.profile if n == 0 else None, *extra)
            busy_before, groups_before = busy_seconds(), cpu_by_process_group()
            began = time.perf_counter()
            pika = baselines.raw_pika_rate(amqp_url, "bench_pika", args.rows)
            busy = (busy_seconds() - busy_before) / (time.perf_counter() - began)
            groups = {k: (v - groups_before.get(k, 0.0)) * 1000 / args.rows for k, v in cpu_by_process_group().items()}
            print(
                f"  raw pika: machine busy {busy:.2f} of 2 cores; CPU ms/row: "
                + ", ".join(f"{k} {v:.3f}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v > 0.002)
            )
            ratios.append(rate / pika)
            print(
                f"round {n + 1}: relay {rate:,.0f} rows/s ({cpu_ms:.3f} relay CPU ms/row), raw pika {pika:,.0f}:"
                f" {rate / pika:.2f} x; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
        print(f"relay / raw pika: {', '.join(f'{r:.2f}' for r in ratios)} (target 0.9)")


if __name__ == "__main__":
    main()
