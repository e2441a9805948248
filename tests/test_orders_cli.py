"""The order system's command line: seed, orders, sagas and the demo, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg
import pytest

from .helpers import scalar
from .integration.processes import ROOT, service_env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def ok(env: dict[str, str], *args: str) -> str:
    result = run(env, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def env(database_url: str, runtime) -> dict[str, str]:
    # A step timeout this short makes every saga overdue at once: nothing runs them here.
    return service_env(database_url, "stub://", ESTAFETA_SAGA_STEP_TIMEOUT="0.01")


def test_seed_creates_accounts_and_stock_once(env: dict[str, str], conn) -> None:
    args = ("seed", "--customers", "3", "--balance", "5000", "--skus", "2", "--stock", "10", "--json")
    assert json.loads(ok(env, *args)) == {"accounts_created": 3, "skus_created": 2}
    assert json.loads(ok(env, *args)) == {"accounts_created": 0, "skus_created": 0}
    assert scalar(conn, "SELECT sum(balance_cents) FROM payments.accounts") == 15_000
    assert scalar(conn, "SELECT string_agg(sku, ',' ORDER BY sku) FROM inventory.stock") == "sku1,sku2"


def test_orders_are_placed_through_the_outbox_and_a_key_places_once(env: dict[str, str], conn) -> None:
    placed = json.loads(
        ok(env, "orders", "place", "--customer", "c1", "--customer", "c2", "--sku", "sku1", "--amount", "700",
           "--count", "4", "--json")
    )  # fmt: skip
    assert [p["placed"] for p in placed] == [True] * 4
    assert scalar(conn, "SELECT string_agg(customer_id, ',' ORDER BY created_at, customer_id) FROM orders.orders")
    assert scalar(conn, "SELECT count(*) FROM orders.orders WHERE customer_id = 'c2'") == 2
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 4

    keyed = (
        "orders",
        "place",
        "--customer",
        "c1",
        "--sku",
        "sku1",
        "--amount",
        "700",
        "--idempotency-key",
        "K",
        "--json",
    )
    first, again = json.loads(ok(env, *keyed)), json.loads(ok(env, *keyed))
    assert first[0]["order_id"] == again[0]["order_id"] and again[0]["placed"] is False
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == 5

    conflict = run(
        env, "orders", "place", "--customer", "c1", "--sku", "sku1", "--amount", "999", "--idempotency-key", "K"
    )
    assert conflict.returncode == 2
    assert conflict.stderr.strip().splitlines() == [
        "estafeta orders place: Invalid value for --idempotency-key: idempotency key 'K' was already used for a"
        " different order"
    ]

    counts = json.loads(ok(env, "orders", "status", "--json"))
    assert counts == {"orders": {"pending": 5, "confirmed": 0, "cancelled": 0}, "sagas": {"running": 5}}
    one = json.loads(ok(env, "orders", "status", first[0]["order_id"], "--json"))
    assert (one["status"], one["sagas"][0]["current_step"]) == ("pending", "charge_payment")
    assert len(json.loads(ok(env, "orders", "list", "--status", "pending", "--json"))) == 5


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["orders", "place", "--customer", "c1", "--sku", "s", "--amount", "1", "--quantity", "0"], "--quantity"),
        (["orders", "place", "--customer", "c1", "--sku", "s"], "Missing option '--amount'"),
        (["orders", "status", "nope"], "'nope' is not a valid UUID"),
        (["orders", "status", str(uuid.UUID(int=1))], "Invalid value for ORDER_ID: no order"),
        (["sagas", "show", str(uuid.UUID(int=1))], "Invalid value for SAGA_ID: no order saga"),
        (["sagas", "abort", str(uuid.UUID(int=1))], "Invalid value for SAGA_ID: no order saga"),
        (["sagas", "list", "--saga", "refund"], "Invalid value for --saga: no saga kind 'refund'"),
        (["sagas", "list", "--status", "lost"], "Invalid value for '--status'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(env: dict[str, str], args: list[str], expected: str) -> None:
    result = run(env, *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.heavy
def test_sagas_can_be_listed_shown_resumed_watched_and_aborted(env: dict[str, str], conn) -> None:
    ok(env, "seed", "--customers", "1", "--balance", "5000", "--skus", "1", "--stock", "10")
    placed = json.loads(ok(env, "orders", "place", "--customer", "c1", "--sku", "sku1", "--amount", "700", "--json"))
    saga_id = placed[0]["saga_id"]
    (listed,) = json.loads(ok(env, "sagas", "list", "--stuck", "--json"))
    assert (listed["saga_id"], listed["status"]) == (saga_id, "running")

    assert "1 saga(s) moved on" in ok(env, "sagas", "resume")
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 2  # the first send, and the resumed one
    assert ok(env, "sagas", "watch", "--once").strip() == "resent 1"
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 2  # the last send never left: back in line

    assert ok(env, "sagas", "abort", saga_id, "--reason", "customer called").strip() == f"saga {saga_id}: compensating"
    shown = json.loads(ok(env, "sagas", "show", saga_id, "--json"))
    assert (shown["status"], shown["last_error"]) == ("compensating", "aborted: customer called")
    assert [e["event"] for e in shown["timeline"]] == ["started", "resumed", "resent", "compensating"]
    text = ok(env, "sagas", "show", saga_id)
    assert "compensating at charge_payment" in text and "last error: aborted: customer called" in text

    again = run(env, "sagas", "abort", saga_id)
    assert again.returncode == 1
    assert again.stderr.strip() == f"estafeta: saga {saga_id} is compensating: nothing to abort"


@pytest.mark.heavy
def test_the_demo_runs_end_to_end_and_reconciles(env: dict[str, str]) -> None:
    env = {**env, "ESTAFETA_SAGA_STEP_TIMEOUT": "30"}
    summary = json.loads(ok(env, "demo", "--orders", "40", "--seed", "3", "--json"))
    assert summary["reconciled"] is True, summary
    # Money is also reconciled from the payments ledger's events, replayed.
    money = summary["reconciliation"]
    assert money["ledger_deposited"] == money["ledger_now"] == money["money_before"], money
    assert money["ledger_events"] > summary["completed"] and money["projection_mismatches"] == []
    assert summary["completed"] + summary["compensated"] == 40
    assert summary["completed"] and summary["compensated"] and not summary["failed"]
    assert summary["duplicates_published"] > 0
    assert summary["duplicates_absorbed"] == summary["duplicates_published"]
    assert summary["latency_p50"] <= summary["latency_p99"]


@pytest.mark.heavy
def test_the_demo_runs_with_each_service_in_a_database_of_its_own(database_url: str) -> None:
    from psycopg import conninfo, sql

    from .services import admin_dsn, scratch_database

    with scratch_database() as base:
        env = service_env(base, "stub://")
        summary = json.loads(ok(env, "demo", "--orders", "20", "--seed", "3", "--json", "--database-per-service"))
        name = conninfo.conninfo_to_dict(base)["dbname"]
        services = ("orders", "payments", "inventory", "notifications", "pingpong")
        try:
            assert summary["reconciled"] is True and summary["completed"] + summary["compensated"] == 20
            with psycopg.connect(conninfo.make_conninfo(base, dbname=f"{name}_payments")) as own:
                assert scalar(own, "SELECT count(*) FROM payments.payments") > 0
                assert scalar(own, "SELECT to_regclass('orders.orders')") is None  # only its own schema
            with psycopg.connect(base) as shared:
                assert scalar(shared, "SELECT to_regclass('payments.payments')") is None
        finally:
            with psycopg.connect(admin_dsn(), autocommit=True) as admin:
                for service in services:
                    admin.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(f"{name}_{service}"))
                    )
