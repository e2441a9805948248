"""Dead letters replayed on RabbitMQ with real processes: fails permanently, parked, fixed, replayed, once."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from ..helpers import scalar, wait_until
from ..lock_steps import open_account
from ..probe import SERVICE as probe
from ..steps import Settle
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def estafeta_json(env: dict[str, str], *args: str) -> object:
    done = processes.estafeta(env, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_step_failing_permanently_is_parked_then_replayed_once_its_cause_is_fixed(
    database_url: str, amqp_url: str, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, amqp_url, ESTAFETA_APP="tests.app", ESTAFETA_MAX_RETRIES="2")
    orders = [uuid.uuid4() for _ in range(3)]
    with conn.transaction():
        for order_id in orders:  # their accounts do not exist yet: every attempt fails
            probe.send(conn, Settle(order_id))
    workers = processes.workers(env, tmp_path, module="tests.worker")
    with processes.running(workers, processes.relay(env, tmp_path)):
        parked = "SELECT count(*) FROM probe.dead_letters WHERE status = 'parked'"
        wait_until(lambda: scalar(conn, parked) == 3, timeout=60, what="three dead letters")
        (group,) = estafeta_json(env, "dead-letters", "groups", "--service", "probe")  # type: ignore[misc]
        assert (group["count"], group["cause"]["error"]) == (3, "LookupError")
        assert group["cause"]["pattern"] == "no account for order <uuid>"
        for order_id in orders:
            open_account(conn, order_id, 1_000)  # the cause, fixed
        dry = estafeta_json(env, "dead-letters", "replay", "--group", group["group"], "--dry-run")
        assert [r["outcome"] for r in dry] == ["would replay"] * 3  # type: ignore[union-attr]
        done = estafeta_json(env, "dead-letters", "replay", "--group", group["group"])
        assert [r["outcome"] for r in done] == ["replayed"] * 3  # type: ignore[union-attr]
        charged = "SELECT count(*) FROM probe.test_charges WHERE charged"
        wait_until(lambda: scalar(conn, charged) == 3, timeout=60, what="the replays' effect")
        again = processes.estafeta(env, "dead-letters", "replay", "--group", group["group"])
        assert again.returncode == 2 and "no parked dead letters in group" in again.stderr
        time.sleep(1.0)  # time for a second effect to show, if there were one
    assert scalar(conn, "SELECT count(*) FROM probe.test_charges") == 3  # once each
    assert scalar(conn, "SELECT sum(balance_cents) FROM probe.test_accounts") == 3 * (1_000 - 100)
    assert scalar(conn, "SELECT count(*) FROM probe.dead_letters WHERE status = 'replayed'") == 3
    assert scalar(conn, parked) == 0
