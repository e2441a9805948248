"""``python -m bench.worker_shape``: the saga and ping/pong rates for each worker shape, in one run.

For every ``--processes`` x ``--threads`` pair, on one broker, ``bench.sagas`` runs its
ping/pong round trips and its order sagas with ``dramatiq estafeta_actors --processes P --threads
T`` (and one ``estafeta relay``), so the defaults can be chosen from figures measured side
by side: the default shape (Dramatiq's: a process per core, 8 threads) is marked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from . import sagas
from .common import describe, machine


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_shape", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=_numbers, default=[1, 2, 4], help="comma-separated (default 1,2,4)")
    parser.add_argument("--threads", type=_numbers, default=[4, 8, 16], help="comma-separated (default 4,8,16)")
    parser.add_argument("--broker", choices=["rabbitmq", "redis"], default="rabbitmq")
    parser.add_argument("--orders", type=int, default=500, help="sagas per shape (default 500)")
    parser.add_argument("--pings", type=int, default=1000, help="ping/pong round trips per shape (default 1000)")
    args = parser.parse_args(argv)
    base = sagas.parser().parse_args(
        ["--broker", args.broker, "--no-peers", "--steady-rate", "0", "--orders", str(args.orders),
         "--pings", str(args.pings)]
    )  # fmt: skip
    rows: list[tuple[int, int, dict[str, Any]]] = []
    for processes in args.processes:
        for threads in args.threads:
            shape = argparse.Namespace(**{**vars(base), "processes": processes, "threads": threads})
            rows.append((processes, threads, sagas.run(shape)[args.broker]))
            print(f"done: {processes} x {threads}", file=sys.stderr, flush=True)
    print(table(rows, args.broker))


def table(rows: list[tuple[int, int, dict[str, Any]]], broker: str) -> str:
    """One line per shape: ping/pong steps/s, sagas/s, p99, CPU per saga step."""
    default = os.cpu_count() or 1
    lines = [
        f"estafeta worker shapes on {broker}: {describe(machine())}",
        f"{'processes x threads':<22}{'ping/pong steps/s':>19}{'sagas/s':>10}{'p50 s':>8}{'p99 s':>8}"
        f"{'CPU ms/step':>13}",
    ]
    for processes, threads, result in rows:
        saga = result["sagas"]
        mark = "  (default)" if (processes, threads) == (default, 8) else ""
        lines.append(
            f"{f'{processes} x {threads}':<22}{result['baseline']['step_messages_per_second']:>19.0f}"
            f"{saga['sagas_per_second']:>10.1f}{saga['latency_p50']:>8.2f}{saga['latency_p99']:>8.2f}"
            f"{saga['cpu_ms_per_step']:>13.2f}{mark}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
