"""PostgreSQL failover under a running order system: the primary crashes, its standby is promoted.

Every estafeta process gets one DSN naming both servers (``host=a,b port=pa,pb
target_session_attrs=read-write``). The primary is stopped with ``pg_ctl stop -m immediate``
(a crash: no checkpoint, every backend gone at once) while sagas run, the relay drains and
the projector tails, and the standby is promoted. Pools must drop their dead connections
and reach the new primary, steps in flight fail and are retried, the inbox absorbs the
re-deliveries, and every invariant of the kill tests holds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from estafeta_actors.kill_and_recover import Plan

from ..pg_servers import PostgresServer, failover_dsn, private_postgres
from .order_runs import (
    SERVICES,
    OrderRun,
    pending_outbox_rows,
    projections_caught_up,
    steps_committed_since,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: Seconds between the crash and the promotion, as a failover manager's detection would take
#: (shorter than Patroni's usual TTL): meanwhile no server accepts writes, the standby is
#: read-only, and every step and pool reconnection fails and backs off.
PROMOTE_AFTER = 3.0


class FailOver(OrderRun):
    """The kill run, with the primary crashed and its standby promoted instead of the processes killed."""

    def __init__(
        self, primary: PostgresServer, standby: PostgresServer, broker_url: str, plan: Plan, log_dir: Path
    ) -> None:
        super().__init__(failover_dsn(primary, standby), broker_url, plan, log_dir)
        self.primary, self.standby = primary, standby
        self.failover: dict[str, Any] = {}

    def _kill_twice(self) -> None:
        plan = self.plan
        self.wait_for("a quarter of the sagas", lambda: self.ended() >= plan.orders // 4, plan.timeout)
        at_kill = self.counts()
        killed_at = time.time()
        self.primary.stop("immediate")
        time.sleep(PROMOTE_AFTER)
        self.standby.promote()
        promoted_at = time.time()
        new_primary = dict.fromkeys(SERVICES, self.standby.dsn())
        wait_until(
            "the first step committed on the promoted standby",
            lambda: steps_committed_since(new_primary, killed_at) > 0,
            plan.timeout,
        )
        first_step_at = time.time()
        self.failover = {
            "at_kill": at_kill,
            "promoted_after_s": round(promoted_at - killed_at, 2),
            "first_step_after_kill_s": round(first_step_at - killed_at, 2),
            "first_step_after_promotion_s": round(first_step_at - promoted_at, 2),
        }
        print(
            f"PostgreSQL failover: promoted {promoted_at - killed_at:.2f} s after the kill; first step committed"
            f" {first_step_at - killed_at:.2f} s after the kill, {first_step_at - promoted_at:.2f} s after promoting"
        )


@pytest.mark.timeout(300)
def test_sagas_relay_and_projector_survive_the_primary_crashing_and_its_standby_taking_over(
    amqp_url: str, tmp_path: Path
) -> None:
    with private_postgres() as primary:
        standby = primary.standby(synchronous=True)
        plan = Plan(orders=100, processes=1, threads=4, step_timeout=4.0, timeout=180)
        run = FailOver(primary, standby, amqp_url, plan, tmp_path)
        try:
            report = run.run()
            print(report, run.failover)
            at_kill = run.failover["at_kill"]
            assert at_kill.get("running", 0) + at_kill.get("compensating", 0) > 0, at_kill  # sagas were in flight
            assert report["orders"] == plan.orders
            assert set(report["sagas"]) <= {"completed", "compensated"}, report["sagas"]
            assert report["reconciled"] is True, report["mismatches"]
            money, stock, ledger = report["money"], report["stock"], report["ledger"]
            assert money[0] == money[1] and stock[0] == stock[1] and ledger == [money[0], money[0]], report
            assert report["projection_mismatches"] == []
            # The relay and the projector reconnected by themselves, to the new primary.
            new_primary = dict.fromkeys(SERVICES, standby.dsn())
            wait_until("the outboxes to drain", lambda: not any(pending_outbox_rows(new_primary).values()), 60)
            wait_until("the projections to catch up", lambda: projections_caught_up(run.env), 60)
        finally:
            run.stop_projector()
        # The crash was felt by the worker processes: steps that were in a transaction failed on
        # the dead primary and were retried, or (steps that keep up can all be between
        # transactions at the kill) the watchdog lost its connection. (Copies the inboxes
        # absorbed are counted, not required: a crash need not cause one.)
        logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("workers-*.log"))
        assert "lost or could not open a connection" in logs, logs[-3000:]
        print(
            f"steps failed on the crash: {logs.count('DatabaseUnavailable:')}, copies absorbed by the inboxes:"
            f" {logs.count('duplicate delivery')}"
        )
