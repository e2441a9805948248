"""The nemesis schedule: every network fault once during a saga workload, then every invariant.

CI runs it with RabbitMQ and every fault once (``CHAOS_FAULT_SECONDS``, 5 s each); ``make
chaos`` holds each fault 60 s and also runs the broker faults with Redis and Kafka as the
broker (``CHAOS_BROKERS=rabbitmq,redis,kafka``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..integration.relay_faults import private_rabbitmq
from ..kafka_server import running_tansu, with_topic_prefix
from ..pg_servers import private_postgres
from ..redis_servers import redis_servers
from .nemesis import NemesisRun, chaos_seed, fault_seconds
from .network import Network, Node, inside

pytestmark = [pytest.mark.heavy, pytest.mark.integration]


def brokers() -> list[str]:
    """``CHAOS_BROKERS`` (``make chaos``: all three), or RabbitMQ alone (CI)."""
    chosen = (os.environ.get("CHAOS_BROKERS") or "rabbitmq").split(",")
    unknown = set(chosen) - {"rabbitmq", "redis", "kafka"}
    if unknown:
        raise ValueError(f"CHAOS_BROKERS: {', '.join(sorted(unknown))} is not rabbitmq, redis or kafka")
    return chosen


@contextlib.contextmanager
def broker_in(kind: str, node: Node, directory: Path) -> Iterator[str]:
    """A private broker of ``kind`` in ``node``'s namespace; its URL."""
    if kind == "rabbitmq":
        with private_rabbitmq(netns=node.netns, host=node.address) as (url, _):
            yield url
    elif kind == "redis":
        with redis_servers(1, directory, netns=node.netns, host=node.address) as (server,):
            yield server.url
    else:
        with running_tansu(netns=node.netns, host=node.address) as server:
            yield with_topic_prefix(server.url)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("broker", brokers())
def test_every_invariant_holds_after_each_network_fault(net: Network, tmp_path: Path, broker: str) -> None:
    seed = chaos_seed()
    print(f"nemesis seed: {seed} (broker {broker})")
    # With RabbitMQ every fault; with the others, the faults of the broker's links.
    full = broker == "rabbitmq"
    names = ["db", "mq", "worker", "relay", "observer"] + (["api", "locks", "holder"] if full else [])
    nodes = {name: net.add(name) for name in names}
    db, mq, locks = nodes["db"], nodes["mq"], nodes.get("locks")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(private_postgres(netns=db.netns, host=db.address))
        broker_url = stack.enter_context(broker_in(broker, mq, tmp_path))
        lock_url = None
        if locks is not None:
            (lock_server,) = stack.enter_context(redis_servers(1, tmp_path, netns=locks.netns, host=locks.address))
            lock_url = lock_server.url
        stack.enter_context(inside(nodes["observer"]))
        run = NemesisRun(
            net, nodes, server.url("postgres"), broker_url, tmp_path, seed=seed, broker=broker,
            kinds=None if full else ("broker",), lock_url=lock_url, fault_seconds=fault_seconds(),
        )  # fmt: skip
        try:
            report = run.run()
            broken = run.invariants(report)
        except BaseException as exc:
            for log in sorted(tmp_path.glob("*.log")):
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")
            raise AssertionError(
                f"seed {seed} (CHAOS_SEED={seed}), broker {broker}, during {run.active!r}: {exc!r}"
            ) from exc
    print(f"nemesis seed {seed}, broker {broker}: the faults and the time the system took to recover after each heal")
    for recovery in run.recoveries:
        fault, unfinished, seconds = recovery["fault"], recovery["in_flight_at_heal"], recovery["recovered_after"]
        print(f"  {fault}: {unfinished} sagas unfinished at the heal, recovered {seconds} s after it")
    print(f"  HTTP: {len(run.accepted)} orders accepted, {sum(n for _, n in run.accepted.values())} requests sent")
    print(f"  fenced lock: {run.fenced.get('answer')!r}")
    assert not broken, (
        f"seed {seed} (CHAOS_SEED={seed}), broker {broker}, after the faults {[r['fault'] for r in run.recoveries]}:\n"
        + "\n".join(map(str, broken))
    )
    assert len(run.recoveries) == len(run.faults)
    # Each cut held its wave back (a lossy or flapping link may only slow it down; the HTTP wave is
    # placed after the heal; the lock fault is beside the workload).
    for recovery in run.recoveries:
        if not any(word in recovery["fault"] for word in ("loss", "lock", "HTTP", "flapping")):
            assert recovery["in_flight_at_heal"] > 0, recovery
    assert report["reconciled"] is True
