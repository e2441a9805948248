"""A saga the watchdog gave up on for want of replies: ``gave_up``, not ``failed``, wherever an operator looks.

The watchdog stops waiting for a step past the point of no return (or a compensation) once
its attempts are spent; the participant may still have acted, and its late answer moves the
saga on. ``sagas show``/``list``, the console and the ``estafeta_sagas`` gauge must tell such a
saga apart from a final failure, and the late answer must leave nothing of the give-up on the
row but its timeline entry. Driven on the virtual clock, message by message.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from estafeta import Clock, Runtime, Watchdog
from estafeta.observability.table_metrics import SagaKind, TablesCollector
from estafeta.testing import VirtualClock
from estafeta_actors.app import app as order_system
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_console.server.web import WebOptions, create_app
from estafeta_sql import saga_reports, saga_writes

from .app import app as tests_app
from .integration.processes import ROOT, service_env
from .shop import Courier, place, saga, seed

CONFIRM = "orders.confirm_order"
REPLY = "orders.saga_order_reply"
#: The order saga's step timeout here, passed on the virtual clock.
TIMEOUT = 30


def gauge(runtime: Runtime, status: str) -> float:
    """``estafeta_sagas{saga="order", status=...}`` as a scrape reads it now."""
    collector = TablesCollector([], [SagaKind("order", ORDER_SAGA.table, runtime.database("orders"))], 60)
    registry = CollectorRegistry()
    registry.register(collector)
    value = registry.get_sample_value("estafeta_sagas", {"saga": "order", "status": status})
    assert value is not None, f"no estafeta_sagas sample for {status}"
    return value


def cli(database_url: str, *args: str) -> str:
    """``estafeta ARGS`` on this test's database; its output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args],
        cwd=ROOT,
        env=service_env(database_url, "stub://"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


def listed(console: TestClient, status: str) -> list[str]:
    """The saga ids the console's list of sagas in ``status`` shows."""
    page = console.get(f"/console/sagas?status={status}")
    assert page.status_code == 200, page.text
    section = page.text.split('id="saga-list"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<tr id="saga-([0-9a-f-]+)">', section)


def give_up_on_confirm(runtime: Runtime, conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, Courier, Any]:
    """An order whose confirmation (past the point of no return) is never answered in time.

    Returns the saga id, the courier, and the first send of the confirmation, held back.
    """
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier = Courier(runtime, conn)
    clock = VirtualClock(Clock(runtime, tests_app.service_names), watchdog=Watchdog(runtime, [ORDER_SAGA]))
    courier.run(hold=frozenset({CONFIRM}))
    held = courier.take(CONFIRM)
    outcomes = []
    for attempt in range(1, 4):
        outcomes.append(dict(clock.advance(timedelta(seconds=TIMEOUT * attempt + 1)).watchdog))
        while courier.pending(CONFIRM):
            courier.take(CONFIRM)  # lost: the participant never sees it
    assert outcomes == [{"resent": 1}, {"resent": 1}, {"gave_up": 1}]
    # At rest: the watchdog has nothing more to do with it, however long it waits.
    assert clock.advance(timedelta(hours=1)).watchdog == {}
    return placed.saga_id, courier, held


def test_a_saga_given_up_for_want_of_replies_is_gave_up_in_the_cli_the_console_and_the_gauge(
    runtime: Runtime, conn: psycopg.Connection[Any], database_url: str, console: TestClient
) -> None:
    saga_id, _, _ = give_up_on_confirm(runtime, conn)
    why = "confirm_order: no reply after 3 attempt(s)"

    shown = json.loads(cli(database_url, "sagas", "show", str(saga_id), "--json"))
    assert (shown["status"], shown["current_step"], shown["last_error"]) == ("gave_up", "confirm_order", why)
    assert (shown["timeline"][-1]["event"], shown["timeline"][-1]["status"]) == ("gave_up", "gave_up")
    text = cli(database_url, "sagas", "show", str(saga_id))
    assert "gave_up at confirm_order" in text and "not final" in text and "Never compensate" in text
    gave_up = json.loads(cli(database_url, "sagas", "list", "--status", "gave_up", "--json"))
    assert [s["saga_id"] for s in gave_up] == [str(saga_id)]
    assert json.loads(cli(database_url, "sagas", "list", "--status", "failed", "--json")) == []
    assert json.loads(cli(database_url, "sagas", "list", "--stuck", "--json")) == []

    assert (gauge(runtime, "gave_up"), gauge(runtime, "failed")) == (1, 0)

    assert listed(console, "gave_up") == [str(saga_id)]
    assert listed(console, "failed") == []
    page = console.get(f"/console/sagas/{saga_id}").text
    assert '<span class="badge warn">gave_up</span>' in page and 'id="gave-up"' in page
    overview = console.get("/console").text
    assert re.search(r'<a href="/console/sagas\?kind=order&amp;status=gave_up">1</a>', overview)
    assert f'href="/console/sagas/{saga_id}"' in overview.split('id="failed-sagas"', 1)[1]

    # Its log is kept for the operator, as a failed saga's is; a harness counts it at rest.
    assert saga_writes.prune_log(conn, ORDER_SAGA.table, timedelta(seconds=1), dry_run=True) == 0
    assert saga_reports.count_ended(conn, ORDER_SAGA.table, [saga_id]) == 1


def test_a_late_answer_moves_a_given_up_saga_on_and_supersedes_its_status_and_error(
    runtime: Runtime, conn: psycopg.Connection[Any], database_url: str
) -> None:
    saga_id, courier, held = give_up_on_confirm(runtime, conn)
    assert courier.deliver(held) == "ok"  # the partition heals: the confirmation was done after all
    assert courier.deliver(courier.take(REPLY)) == "ok"  # its late answer is taken
    courier.run()
    row = saga(conn, saga_id)
    assert (row.status, row.last_error) == ("completed", None)

    shown = json.loads(cli(database_url, "sagas", "show", str(saga_id), "--json"))
    assert (shown["status"], shown["last_error"]) == ("completed", None)
    # The timeline keeps the give-up: what happened, in order.
    events = [(e["event"], e["status"]) for e in shown["timeline"]]
    assert events[-3:] == [("gave_up", "gave_up"), ("advanced", "running"), ("completed", "completed")]
    assert (gauge(runtime, "gave_up"), gauge(runtime, "completed")) == (0, 1)
