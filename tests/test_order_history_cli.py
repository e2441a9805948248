"""`orders status ORDER_ID` with the order's timeline, and `orders history [--as-of]`, as a user runs them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from estafeta import Projector, Runtime
from estafeta_actors import orders
from estafeta_actors.order_events import STORE
from estafeta_actors.order_history import OrderSummary

from .helpers import scalar
from .integration.processes import service_env
from .shop import Courier, place, seed
from .test_order_history import catch_up
from .test_orders_cli import ok, run

CHARGE = "payments.charge_payment"
REPLY = "orders.saga_order_reply"


@pytest.fixture
def env(database_url: str, runtime: Runtime) -> dict[str, str]:
    return service_env(database_url, "stub://")


@pytest.fixture
def projector(conn: psycopg.Connection[Any]) -> Projector:
    projector = Projector(OrderSummary(), STORE)
    projector.create_tables(conn)
    return projector


def _paid_then_confirmed(runtime: Runtime, conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, datetime]:
    """An order confirmed end to end, and a time between its payment and its confirmation."""
    courier = Courier(runtime, conn)
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    assert courier.deliver(courier.take(REPLY)) == "ok"
    paid = scalar(conn, "SELECT clock_timestamp()")
    courier.run()
    return placed.order_id, paid


def test_status_shows_the_timeline_and_keeps_its_fields(
    env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any], projector: Projector
) -> None:
    order_id, _ = _paid_then_confirmed(runtime, conn)
    catch_up(conn, projector)
    shown = json.loads(ok(env, "orders", "status", str(order_id), "--json"))
    assert (shown["order_id"], shown["status"], shown["amount_cents"]) == (str(order_id), "confirmed", 3_000)
    assert shown["sagas"][0]["status"] == "completed"
    history = shown["history"]
    assert [e["what"] for e in history["timeline"]] == ["placed", "paid", "reserved", "confirmed", "notified"]
    assert history["status"] == "confirmed" and history["confirmed_at"] is not None
    assert shown["projection_lag"] == {"events": 0, "seconds": None}
    text = ok(env, "orders", "status", str(order_id)).splitlines()
    assert text[0] == f"order {order_id}: confirmed (c1, 2 x s1, 3000 cents)"
    assert text[2] == "history (order_summary projection):"
    assert text[3].split() == ["AT", "WHAT", "DETAIL"]
    assert [line.split()[3] for line in text[4:]] == ["placed", "paid", "reserved", "confirmed", "notified"]


def test_status_says_how_far_the_projection_is_behind(
    env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any], projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    shown = json.loads(ok(env, "orders", "status", str(placed.order_id), "--json"))
    assert shown["history"] is None and shown["projection_lag"]["events"] == 1
    text = ok(env, "orders", "status", str(placed.order_id))
    assert "history (order_summary projection, 1 event(s) behind, the oldest" in text


def test_status_without_the_projection_says_so(
    env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("DROP TABLE IF EXISTS orders.order_summary")
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    text = ok(env, "orders", "status", str(placed.order_id))
    assert "history: the order_summary projection has not run yet" in text


def test_history_as_of_shows_a_past_state(env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any]) -> None:
    order_id, paid = _paid_then_confirmed(runtime, conn)
    then = json.loads(ok(env, "orders", "history", str(order_id), "--as-of", paid.isoformat(), "--json"))
    assert (then["status"], then["paid_at"] is not None, then["confirmed_at"]) == ("pending", True, None)
    assert [e["what"] for e in then["timeline"]] == ["placed", "paid"]
    text = ok(env, "orders", "history", str(order_id), "--as-of", paid.isoformat()).splitlines()
    assert text[0] == f"order {order_id} as of {paid.isoformat()}: pending (c1, 2 x s1, 3000 cents)"
    assert text[1].split() == ["AT", "WHAT", "DETAIL"]
    assert [line.split()[3] for line in text[2:]] == ["placed", "paid"]
    latest = json.loads(ok(env, "orders", "history", str(order_id), "--json"))
    assert (latest["status"], len(latest["timeline"]), latest["as_of"]) == ("confirmed", 5, None)
    # Without an offset the time is UTC.
    naive = paid.astimezone(UTC).replace(tzinfo=None)
    utc = json.loads(ok(env, "orders", "history", str(order_id), "--as-of", naive.isoformat(), "--json"))
    assert [e["what"] for e in utc["timeline"]] == ["placed", "paid"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["orders", "history", "nope"], "'nope' is not a valid UUID"),
        (["orders", "history", str(uuid.UUID(int=1))], "Invalid value for ORDER_ID: no order"),
        (["orders", "history", str(uuid.UUID(int=1)), "--as-of", "yesterday"], "'yesterday' is not an ISO 8601 time"),
        (["orders", "history"], "Missing argument 'ORDER_ID'"),
    ],
)
def test_bad_history_input_is_one_line_and_exit_code_2(env: dict[str, str], args: list[str], expected: str) -> None:
    result = run(env, *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_history_before_an_order_existed_or_never_recorded(
    env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any], projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    early = run(env, "orders", "history", str(placed.order_id), "--as-of", "2020-01-01T00:00:00Z")
    assert early.returncode == 1
    assert early.stderr.strip().startswith(f"estafeta: order {placed.order_id} was not placed yet at 2020-01-01T00:00")
    legacy = uuid.uuid4()
    with runtime.database("orders").transaction() as tx:  # an order placed before its history was recorded
        orders.insert_order(tx, legacy, customer_id="c1", sku="s1", quantity=1, amount_cents=100, idempotency_key=None)
    assert "history: none recorded (the order was placed before" in ok(env, "orders", "status", str(legacy))
    older = run(env, "orders", "history", str(legacy))
    assert older.returncode == 1
    assert (
        older.stderr.strip()
        == f"estafeta: order {legacy} has no recorded history: it was placed before the orders service recorded events"
    )
