"""``python -m bench.relay_idle``: what an idle relay costs the machine, by poll interval.

    python -m bench.relay_idle [--poll 0.05 --poll 1] [--seconds 10] [--amqp-url URL]

On a scratch database with the order system's outboxes (five services), all empty, one
``estafeta relay`` process (its default two lanes) runs for each poll interval in turn;
after a few seconds to settle, the CPU of the relay process and of its database backends
is read from ``/proc`` over ``--seconds``. Nothing is written: every poll finds nothing,
which is what most polls find once hand-offs carry the messages (``ESTAFETA_HANDOFFS``).
CPU ms per second of wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from . import cpu
from .common import add_database_url, describe, machine, scratch_database, stop
from .sagas import _migrate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: The relay's lanes (its default), each polling on its own.
LANES = 2


def idle(dsn: str, amqp_url: str, poll: float, seconds: float) -> dict[str, float]:
    """A relay polling every ``poll`` seconds on ``dsn``'s empty outboxes: its and its backends' CPU ms/s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
    env.update(
        ESTAFETA_DATABASE_URL=dsn,
        ESTAFETA_BROKER_URL=amqp_url,
        ESTAFETA_RELAY_POLL_INTERVAL=str(poll),
        PYTHONPATH=str(ROOT),
    )
    relay = subprocess.Popen(
        [str(BIN / "estafeta"), "relay", "--lanes", str(LANES)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(3)  # connected, listening, past the first drain
        with psycopg.connect(dsn, autocommit=True) as conn:
            backends = [
                int(pid)
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchall()
            ]
        started, relay_before = time.monotonic(), cpu.process_cpu(relay.pid)
        backends_before = {pid: cpu.process_cpu(pid) for pid in backends}
        time.sleep(seconds)
        wall = time.monotonic() - started
        relay_ms = 1000 * (cpu.process_cpu(relay.pid) - relay_before) / wall
        backend_ms = 1000 * sum(cpu.process_cpu(pid) - before for pid, before in backends_before.items()) / wall
    finally:
        stop([relay])
    return {"poll": poll, "relay": relay_ms, "backends": backend_ms}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_idle", description=__doc__.split("\n")[0])
    parser.add_argument("--poll", type=float, action="append", help="a poll interval, in seconds (default 0.05 and 1)")
    parser.add_argument("--seconds", type=float, default=10, help="how long each relay is measured (default 10)")
    add_database_url(parser)
    parser.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    args = parser.parse_args()
    polls = args.poll or [0.05, 1.0]
    if any(p <= 0 for p in polls):
        parser.error(f"--poll must be positive, not {min(polls)}")
    with scratch_database(args.database_url, _migrate) as dsn:
        found = [idle(dsn, args.amqp_url, poll, args.seconds) for poll in polls]
    print(f"idle relay ({LANES} lanes, 5 empty outboxes): {describe(machine())}")
    print(f"{'poll s':>8}{'relay CPU ms/s':>16}{'backends CPU ms/s':>19}")
    for r in found:
        print(f"{r['poll']:>8g}{r['relay']:>16.1f}{r['backends']:>19.1f}")


if __name__ == "__main__":
    main()
