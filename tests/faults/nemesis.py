"""A nemesis schedule as Jepsen runs one: network faults, one at a time, during a saga workload.

The order system runs in the fault harness: PostgreSQL, RabbitMQ, the ``dramatiq actors``
workers and ``estafeta relay`` each in a namespace of their own, the test (and the
``estafeta`` commands it runs) in an observer's. Before each fault a wave of orders is
placed (``estafeta orders place``, as the kill runs do) once the fault has started, so its
sagas run into it; the fault lasts ``fault_seconds`` and is healed; the time until every
saga of the wave has ended is that fault's recovery time. After the last fault, the same invariants as the
kill runs (``actors.kill_and_recover``): every saga final, money and stock conserved,
nobody charged twice, the ledger's replay equal to its projection.

The order of the faults comes from a seed, printed first: ``CHAOS_SEED=<seed>``
replays a run's order. CI's run holds each fault 10 s, less than any client's bound for a
silent link (TCP retransmits and the same connections carry on); ``make chaos`` holds them
``CHAOS_FAULT_SECONDS`` (60 s), past every bound, so every client must give up
its connection, reconnect, and the work in flight must be retried.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import psycopg

from actors.kill_and_recover import Child, KillAndRecover, Plan

from .network import Network, Node


@attrs.frozen
class Fault:
    """One fault of the schedule: its name and how to start it (healing is ``heal_all``)."""

    name: str
    start: Callable[[], None]


def schedule(net: Network, nodes: dict[str, Node], seed: int) -> list[Fault]:
    """Every fault once, in the seed's order."""
    db, mq, worker, relay = nodes["db"], nodes["mq"], nodes["worker"], nodes["relay"]
    faults = [
        Fault("worker <-> database cut", lambda: net.cut(worker, db)),
        Fault("relay <-> broker cut", lambda: net.cut(relay, mq)),
        Fault("worker <-> broker cut", lambda: net.cut(worker, mq)),
        Fault(
            "database -> worker lost (one way: requests arrive, answers do not)", lambda: net.cut_one_way(db, worker)
        ),
        Fault("10 % loss on every link", lambda: _everywhere(net, 10)),
    ]
    random.Random(seed).shuffle(faults)
    return faults


def _everywhere(net: Network, percent: int) -> None:
    nodes = list(net.nodes.values())
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            net.lossy(a, b, percent)


def fault_seconds() -> float:
    """``CHAOS_FAULT_SECONDS`` (``make chaos``: longer than every client's bound), or 10 (CI's run)."""
    return float(os.environ.get("CHAOS_FAULT_SECONDS") or 10)


def chaos_seed() -> int:
    """``CHAOS_SEED``, or a new one."""
    return int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**31))


class NemesisRun(KillAndRecover):
    """:class:`KillAndRecover` with its processes in the harness's namespaces and faults instead of kills.

    Construct and run it inside the observer's namespace (``inside(observer)``): its own
    connections, and the pools' threads it starts, then live there.
    """

    def __init__(
        self,
        net: Network,
        nodes: dict[str, Node],
        database_url: str,
        broker_url: str,
        log_dir: Path,
        *,
        seed: int,
        wave: int = 20,
        fault_seconds: float = 10.0,
        recovery_timeout: float = 180.0,
    ) -> None:
        faults = schedule(net, nodes, seed)
        plan = Plan(orders=wave * len(faults), processes=1, threads=4, step_timeout=5.0, timeout=300, kill=False)
        super().__init__(database_url, broker_url, plan, log_dir)
        self.net, self.nodes, self.seed = net, nodes, seed
        self.faults = faults
        self.wave = wave
        self.fault_seconds = fault_seconds
        self.recovery_timeout = recovery_timeout
        #: One entry per fault: its name, its wave's sagas unfinished at the heal, and the
        #: seconds from the heal until they had all ended.
        self.recoveries: list[dict[str, Any]] = []

    def start(self, *, relay: bool = True) -> None:
        """The workers in the worker's namespace, the relay in the relay's."""
        workers = [str(self.bin / "dramatiq"), "actors", "--processes", "1", "--threads", str(self.plan.threads)]
        self.workers = Child("workers", self.nodes["worker"].command(*workers), self.env, self.log_dir)
        if relay:
            argv = self.nodes["relay"].command(str(self.bin / "estafeta"), "relay")
            self.relay = Child("relay", argv, self.env, self.log_dir)

    def _place_and_survive(self) -> None:
        print(f"nemesis: seed {self.seed} (CHAOS_SEED={self.seed} replays this order)", flush=True)
        for number, fault in enumerate(self.faults, 1):
            print(f"nemesis: fault {number}: {fault.name}, for {self.fault_seconds:g} s", flush=True)
            fault.start()
            began = time.monotonic()
            # The wave is placed (from the observer, whose links stay whole) while the fault is on.
            self._place_wave(number)
            time.sleep(max(self.fault_seconds - (time.monotonic() - began), 0.0))
            placed = self.wave * number
            in_flight = placed - self.ended()
            self.net.heal_all()
            healed = time.monotonic()
            self._wait_for_wave(fault, placed)
            seconds = round(time.monotonic() - healed, 1)
            self.recoveries.append({"fault": fault.name, "in_flight_at_heal": in_flight, "recovered_after": seconds})
            print(
                f"nemesis: fault {number}: {in_flight} sagas of its wave unfinished at the heal;"
                f" all ended {seconds} s after it",
                flush=True,
            )

    def unfinished_or_failed(self) -> list[dict[str, Any]]:
        """The run's sagas that did not end completed or compensated, with their step, attempts and last error."""
        query = """SELECT s.saga_id, s.status, s.current_step, s.attempts, s.last_error, o.status
                   FROM orders.saga_order s JOIN orders.orders o USING (order_id)
                   WHERE starts_with(o.customer_id, %s) AND s.status NOT IN ('completed', 'compensated')"""
        columns = ("saga_id", "status", "step", "attempts", "last_error", "order_status")
        with psycopg.connect(self.settings.database_url_for("orders"), autocommit=True) as conn:
            return [dict(zip(columns, row, strict=True)) for row in conn.execute(query, (self.prefix,)).fetchall()]

    def _wait_for_wave(self, fault: Fault, placed: int) -> None:
        self.wait_for(f"the wave of {fault.name!r} to end", lambda: self.ended() >= placed, self.recovery_timeout)

    def _place_wave(self, number: int) -> None:
        plan, prefix = self.plan, self.prefix
        place = ["orders", "place", "--quantity", "1", "--amount", str(plan.amount), "--count", str(self.wave)]
        place += [a for i in range(1, plan.customers + 1) for a in ("--customer", f"{prefix}c{i}")]
        place += [a for i in range(1, plan.skus + 1) for a in ("--sku", f"{prefix}sku{i}")]
        self.estafeta(*place)
