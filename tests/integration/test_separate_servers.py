"""The order system with each of its four services on a PostgreSQL server of its own, under SIGKILL.

Four private servers on four ports, ``ESTAFETA_<SERVICE>_DATABASE_URL`` for each; the workers
and the relay are SIGKILLed mid-run and restarted (the kill run of test_saga_kill), a projector
runs beside them. Every saga must end, money and stock be conserved, each service's rows be on
its own server only, and the relay and the projectors must be connected to the servers whose
outboxes and event logs they serve, and to no other.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psycopg
import pytest

from estafeta_actors.kill_and_recover import Plan

from ..helpers import scalar
from ..pg_servers import private_postgres
from .order_runs import SERVICES, OrderRun, applications, pending_outbox_rows, projections_caught_up, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: The services with projections to run (orders: the order history; the ledger's accounts are kept inside its steps).
PROJECTED = {"orders"}


class SeparateServers(OrderRun):
    """The kill run, noting which estafeta processes are connected to each server before it stops them."""

    def __init__(self, dsns: dict[str, str], broker_url: str, plan: Plan, log_dir: Path) -> None:
        extra = {f"ESTAFETA_{service.upper()}_DATABASE_URL": dsn for service, dsn in dsns.items()}
        super().__init__(dsns["orders"], broker_url, plan, log_dir, extra_env=extra)
        self.dsns = dsns
        self.connected: dict[str, set[str]] = {}

    def _half_and_compensating(self) -> bool:
        # The second kill needs only half the sagas ended (what the test checks): on 100
        # orders the compensations can all be over by then, and waiting for one to be in
        # flight waited for the end and skipped the kill (CI: one kill, every saga ended).
        return self.ended() >= self.plan.orders // 2

    def _place_and_survive(self) -> None:
        super()._place_and_survive()
        wait_until("the outboxes to drain", lambda: not any(pending_outbox_rows(self.dsns).values()), 60)
        wait_until("the projections to catch up", lambda: projections_caught_up(self.env), 60)
        self.connected = {service: applications(dsn) for service, dsn in self.dsns.items()}


@pytest.mark.timeout(300)
def test_every_saga_ends_with_each_service_on_its_own_server(amqp_url: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        servers = {service: stack.enter_context(private_postgres()) for service in SERVICES}
        dsns = {service: server.dsn() for service, server in servers.items()}
        plan = Plan(orders=100, processes=1, threads=4, step_timeout=4.0, timeout=180)
        run = SeparateServers(dsns, amqp_url, plan, tmp_path)
        try:
            report = run.run()
        finally:
            run.stop_projector()
        print(report, run.connected)
        first, second = report["kills"]
        # Killed with sagas in flight (running or compensating: on a fast day only compensating
        # ones were left at the first kill, and the report leaves out states with none), then
        # again once half had ended (the second kill aims at compensating sagas; on 100 orders
        # they may all have ended between the look and the kill).
        in_flight_at_first = first.get("running", 0) + first.get("compensating", 0)
        ended_at_second = second.get("completed", 0) + second.get("compensated", 0) + second.get("failed", 0)
        assert in_flight_at_first > 0 and first["relay_killed"], first
        assert ended_at_second >= plan.orders // 2, second
        assert report["orders"] == plan.orders
        assert set(report["sagas"]) <= {"completed", "compensated"}, report["sagas"]
        assert report["reconciled"] is True, report["mismatches"]
        money, ledger = report["money"], report["ledger"]
        assert money[0] == money[1] and ledger == [money[0], money[0]] and report["projection_mismatches"] == []
        # The relay drains every server's outbox; projectors tail only the servers with event logs.
        for service, names in run.connected.items():
            assert {"estafeta-relay", "estafeta-relay-listener"} <= names, (service, names)
            projecting = {n for n in names if n.startswith("estafeta-projector")}
            assert bool(projecting) == (service in PROJECTED), (service, names)
        # Each service's tables are on its own server only.
        for service, dsn in dsns.items():
            with psycopg.connect(dsn) as conn:
                for other in SERVICES:
                    has = scalar(conn, "SELECT to_regnamespace(%s) IS NOT NULL", other)
                    assert has == (other == service), f"{other}'s schema on {service}'s server"
