"""``python -m bench.wakeups``: append and step throughput under each ``ESTAFETA_WAKEUP`` policy, 1-16 writers, one run.

Every outbox insert and event append NOTIFYs inside its transaction (``notify``), and
PostgreSQL commits notifying transactions one at a time (the lock on the notification
queue is taken at the commit and held until it is flushed). The other policies:
``after-commit`` (the transaction sends nothing; a waker thread of the writer's process
NOTIFYs from a connection of its own once it has committed, coalescing what piles up) and
``poll`` (no NOTIFY at all). On a scratch database, with one LISTEN connection reading
both channels (as a relay and a projector would), writers run for ``--seconds``, as threads
of ``--processes`` processes (2, the default worker shape; ``--processes 16`` gives each
writer a process, and a waker, of its own):

- **append**: one transaction per single-event append, each writer to its own streams;
- **step**: the ping step delivered by ``estafeta.deliver`` (count, inbox row, the ping's
  row, its outbox row, commit), as a worker thread runs it.

The policies take turns at each writer count (``--rounds`` times; the median is shown), so
the machine's noise falls on all three. The writer processes are started once and reused.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from estafeta_sql import migrate

from .common import admin_dsn, machine, scratch_database
from .cpu import process_cpu

POLICIES = ("notify", "after-commit", "poll")
KINDS = ("append", "step")
SCHEMA = "wake_events"


def prepare(dsn: str) -> None:
    """The event store's schema, and the order system's services (the ping step's among them)."""
    from estafeta import Runtime, Settings
    from estafeta_actors.app import app

    with psycopg.connect(dsn, autocommit=True) as conn:
        directories = [migrate.builtin_directory("_common"), migrate.builtin_directory("_events")]
        migrate.apply(conn, SCHEMA, migrate.load(directories))
    runtime = Runtime(Settings(database_url=dsn))
    runtime.migrate(app.services)
    runtime.close()


def _threads(count: int, work: Any) -> int:
    """Run ``work(thread_index)`` on ``count`` threads; the sum of what they return."""
    done = [0] * count

    def run(i: int) -> None:
        done[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done)


def _appends(dsn: str, policy: str, start_at: float, seconds: float, index: int, threads: int) -> int:
    from estafeta.events.store import EventStore
    from estafeta.messaging.wakeups import Waker

    from .events_workers import STREAMS, ItemAdded, registry

    store = EventStore(SCHEMA, registry)
    # One waker per process, as a worker process has: its threads' wake-ups share its rounds.
    waker = Waker(dsn) if policy == "after-commit" else None

    def writer(thread: int) -> int:
        prefix = f"cart-{index}-{thread}-{uuid.uuid4().hex[:8]}"
        versions = [0] * STREAMS
        done = 0
        with psycopg.connect(dsn) as conn:
            if policy != "notify":  # what a step's transaction (after-commit) or a poll pool's session says
                conn.execute("SELECT set_config('estafeta.wakeup', %s, false)", (policy,))
                conn.commit()
            time.sleep(max(0.0, start_at - time.time()))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                stream = done % STREAMS
                store.append(conn, f"{prefix}-{stream}", [ItemAdded("sku-42", 3)], expected_version=versions[stream])
                conn.commit()
                if waker is not None:
                    waker.wake(SCHEMA)
                versions[stream] += 1
                done += 1
            _linger(start_at, seconds)
        return done

    done = _threads(threads, writer)
    if waker is not None:
        waker.close()
    return done


def _linger(start_at: float, seconds: float) -> None:
    """Keep this writer's connections until the measuring process has read their backends' CPU."""
    time.sleep(max(0.0, start_at + seconds + 0.6 - time.time()))


def _steps(dsn: str, policy: str, start_at: float, seconds: float, index: int, threads: int) -> int:
    import dramatiq

    from estafeta import Runtime, Settings, deliver
    from estafeta.messaging.messages import to_json
    from estafeta_actors.app import app
    from estafeta_actors.pingpong import Ping

    # As a worker process: its threads share one runtime (a pool, a waker).
    runtime = Runtime(Settings(database_url=dsn, wakeup=policy, pool_size=threads))
    spec = app.steps["pingpong.ping"]

    def message() -> dramatiq.Message[Any]:
        ping = Ping(uuid.uuid4(), datetime.now(UTC))
        return dramatiq.Message(
            queue_name="pingpong", actor_name="pingpong.ping", args=(to_json(ping),), kwargs={}, options={}
        )

    def writer(_thread: int) -> int:
        deliver(spec, runtime, message())  # connected, statements prepared
        done = 0
        time.sleep(max(0.0, start_at - time.time()))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            deliver(spec, runtime, message())
            done += 1
        return done

    done = _threads(threads, writer)
    _linger(start_at, seconds)
    runtime.close()
    return done


def _serve(dsn: str, tasks: Any, results: Any) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        kind, policy, start_at, seconds, index, threads = task
        work = _appends if kind == "append" else _steps
        results.put(work(dsn, policy, start_at, seconds, index, threads))


class Writers:
    """Writer processes started once; a measurement of ``n`` writers runs them as threads of the first ones."""

    def __init__(self, dsn: str, count: int) -> None:
        #: Writer processes (the rest of the writers are their threads).
        self.per_count = count
        context = multiprocessing.get_context("spawn")
        self.tasks = [context.Queue() for _ in range(count)]
        self.results: Any = context.Queue()
        self.processes = [
            context.Process(target=_serve, args=(dsn, tasks, self.results), daemon=True) for tasks in self.tasks
        ]
        for process in self.processes:
            process.start()
        self.probe = psycopg.connect(dsn, autocommit=True)

    def rate(self, kind: str, policy: str, writers: int, seconds: float) -> tuple[float, float]:
        """(operations per second over ``writers`` writers, CPU ms per operation of the writers and their backends).

        The CPU is that of the writer processes and of the PostgreSQL backends connected to
        the run's database (``/proc``), not the machine's: other work on a shared machine
        does not count.
        """
        start_at = time.time() + 1.5  # every writer set up (a step writer builds a runtime) before
        # As the default worker shape: up to 2 processes, the writers spread over their threads.
        processes = min(self.per_count, writers)
        for index in range(processes):
            threads = writers // processes + (1 if index < writers % processes else 0)
            self.tasks[index].put((kind, policy, start_at, seconds, index, threads))
        time.sleep(max(0.0, start_at - time.time()))
        before = self._cpu()
        time.sleep(max(0.0, start_at + seconds + 0.3 - time.time()))
        after = self._cpu()
        total = sum(int(self.results.get(timeout=seconds + 120)) for _ in range(processes))
        spent = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
        return total / seconds, spent * 1000 / max(total, 1)

    def _cpu(self) -> dict[int, float]:
        rows = self.probe.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        pids = [int(r[0]) for r in rows] + [p.pid for p in self.processes if p.pid is not None]
        return {pid: process_cpu(pid) for pid in pids}

    def close(self) -> None:
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(timeout=30)
        self.probe.close()


def _listen(dsn: str, stop: threading.Event, heard: list[int]) -> None:
    """Read both channels, as a relay and a projector do (a queue nobody reads only grows)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN estafeta_outbox")
        conn.execute("LISTEN estafeta_events")
        while not stop.is_set():
            heard[0] += sum(1 for _ in conn.notifies(timeout=0.2))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure: ``{kind: {writers: {policy: [ops/s, CPU ms/op]}}}``, medians over the rounds."""
    counts = [int(n) for n in args.writers.split(",")]
    with scratch_database(admin_dsn(), prepare) as dsn:
        stop, heard = threading.Event(), [0]
        listener = threading.Thread(target=_listen, args=(dsn, stop, heard), daemon=True)
        listener.start()
        writers = Writers(dsn, args.processes)
        samples: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
        try:
            for _ in range(args.rounds):
                for kind in KINDS:
                    for n in counts:
                        for policy in POLICIES:
                            figure = writers.rate(kind, policy, n, args.seconds)
                            samples.setdefault((kind, n, policy), []).append(figure)
                            if not args.quiet:
                                print(f"... {kind} {n} {policy}: {figure[0]:,.0f}/s", flush=True)
        finally:
            writers.close()
            stop.set()
            listener.join(5)
    result: dict[str, Any] = {kind: {} for kind in KINDS}
    for (kind, n, policy), values in samples.items():
        rate = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        result[kind].setdefault(str(n), {})[policy] = [round(rate, 1), round(cpu, 3)]
    result["notifications_heard"] = heard[0]
    return result


def table(result: dict[str, Any], info: dict[str, Any]) -> str:
    lines = [
        f"estafeta wake-up policies: {info['cores']} cores, {info['cpu']}; load average {os.getloadavg()[0]:.2f}"
        " at the end (the run's own writers included)",
        f"{'':<22}" + "".join(f"{p:>24}" for p in POLICIES),
    ]
    for kind in KINDS:
        title = "append, 1 event per transaction" if kind == "append" else "ping step (estafeta.deliver)"
        lines.append(f"{title}: per second (CPU ms each: writers and their backends), x notify")
        for n, by_policy in result[kind].items():
            base = by_policy["notify"][0]
            cells = []
            for policy in POLICIES:
                rate, cpu = by_policy[policy]
                cells.append(f"{rate:>8,.0f} ({cpu:.2f}) {rate / base:4.2f}x")
            lines.append(f"  {n:>2} writers{'':<10}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeups", description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,4,8,16", help="writer counts (default 1,4,8,16)")
    parser.add_argument(
        "--processes", type=int, default=2, help="writer processes, the writers spread over their threads (default 2)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per figure (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of the three policies (default 2; median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    info = machine()
    result = run(args)
    print(json.dumps({"machine": info, "results": result}) if args.json else table(result, info))


if __name__ == "__main__":
    main()
