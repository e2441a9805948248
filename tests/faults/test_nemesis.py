"""The nemesis schedule: every network fault once during a saga workload, then the kill runs' invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..integration.relay_faults import private_rabbitmq
from ..pg_servers import private_postgres
from .nemesis import NemesisRun, chaos_seed, fault_seconds
from .network import Network, inside

pytestmark = [pytest.mark.heavy, pytest.mark.integration]


@pytest.mark.timeout(900)
def test_every_saga_ends_and_every_order_is_accounted_for_after_each_network_fault(
    net: Network, tmp_path: Path
) -> None:
    seed = chaos_seed()
    print(f"nemesis seed: {seed}")
    nodes = {name: net.add(name) for name in ("db", "mq", "worker", "relay", "observer")}
    db, mq = nodes["db"], nodes["mq"]
    with (
        private_postgres(netns=db.netns, host=db.address) as server,
        private_rabbitmq(netns=mq.netns, host=mq.address) as (broker_url, _),
        inside(nodes["observer"]),
    ):
        run = NemesisRun(
            net, nodes, server.url("postgres"), broker_url, tmp_path, seed=seed, fault_seconds=fault_seconds()
        )
        try:
            report = run.run()
            offending = run.unfinished_or_failed()
        except BaseException:
            for log in sorted(tmp_path.glob("*.log")):
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")
            raise
    print(f"nemesis seed {seed}: recoveries {run.recoveries}")
    print(report)
    assert len(run.recoveries) == len(run.faults)
    # Each cut held its wave back (a lossy link may only slow it down).
    for recovery in run.recoveries:
        if "loss" not in recovery["fault"]:
            assert recovery["in_flight_at_heal"] > 0, recovery
    assert report["orders"] == run.plan.orders
    assert offending == [], f"seed {seed}: sagas not completed or compensated: {offending}"
    assert report["mismatches"] == [], report["mismatches"]
    money, stock, ledger = report["money"], report["stock"], report["ledger"]
    assert money[0] == money[1] and stock[0] == stock[1], (money, stock)
    assert ledger == [money[0], money[0]], (ledger, money)
    assert report["projection_mismatches"] == [], report["projection_mismatches"]
    assert report["reconciled"] is True
