"""What the CLI prints for a person: a header over every table, and every time with its date, in UTC.

The commands run as a user runs them (subprocesses on the run's database), with the
database session in New York's time zone: a time printed as the session hands it over
would be hours off, or lack its date.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import click
import psycopg
import pytest

from estafeta import Projector, Runtime, Scheduler
from estafeta.observability.heartbeats import Heartbeat, Kind, Role
from estafeta_actors.order_events import STORE
from estafeta_actors.order_history import OrderSummary
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_cli.tables import table_lines, when
from estafeta_sql import sagas

from .helpers import scalar
from .integration.processes import service_env
from .shop import place
from .test_dead_letters import park
from .test_order_history import catch_up
from .test_orders_cli import ok

#: The database session's zone in the commands' environment: far from UTC, both sides of midnight.
SESSION_ZONE = "America/New_York"


def utc(moment: datetime, *, precise: bool = False) -> str:
    """How a time must read: its UTC date and time, and the zone."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC" if precise else "%Y-%m-%d %H:%M:%S UTC")


def table(text: str, first: str) -> tuple[list[str], list[list[str]]]:
    """The header that starts with the column ``first`` and the rows under it, cells split at 2+ spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() and line.split()[0] == first)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start:end]]
    return header, rows


@pytest.fixture
def env(database_url: str, runtime: Runtime) -> dict[str, str]:
    return service_env(database_url, "stub://", PGTZ=SESSION_ZONE)


def test_a_table_has_a_header_numbers_right_aligned_and_one_line_per_row() -> None:
    lines = table_lines(
        ("NAME", "COUNT", "WAIT (S)", "NOTE"),
        [("a", 5, 1.25, "two\nlines"), ("longer", 12, 10.0, None)],
        red=[False, True],
    )
    assert lines[0] == "NAME    COUNT  WAIT (S)  NOTE"
    assert lines[1] == "a           5       1.2  two lines"
    assert lines[2] == click.style("longer     12      10.0  -", fg="red")
    assert table_lines(("ONE", "TWO"), []) == ["ONE  TWO"]


def test_a_time_prints_in_utc_with_its_date() -> None:
    evening = datetime(2026, 11, 30, 21, 5, 7, 123456, tzinfo=timezone(timedelta(hours=-5)))
    assert when(evening) == "2026-12-01 02:05:07 UTC"
    assert when(evening, precise=True) == "2026-12-01 02:05:07.123456 UTC"
    assert when(None) == "-"


def test_orders_list_and_sagas_list_print_a_header_and_utc_dates(env: dict[str, str], runtime: Runtime, conn) -> None:
    placed = [place(runtime, f"c{i}", "sku1", i, 100 * i) for i in (1, 2)]
    header, rows = table(ok(env, "orders", "list"), "CREATED")
    assert header == ["CREATED", "ORDER", "STATUS", "CUSTOMER", "QUANTITY", "SKU", "AMOUNT (CENTS)"]
    created = dict(conn.execute("SELECT order_id::text, created_at FROM orders.orders").fetchall())
    assert {(r[1], r[0]) for r in rows} == {(order, utc(at)) for order, at in created.items()}
    assert ["c2", "2", "sku1", "200"] in [r[3:] for r in rows]

    header, rows = table(ok(env, "sagas", "list"), "STARTED")
    assert header == ["STARTED", "SAGA", "STATUS", "STEP", "VERSION", "LAST ERROR"]
    started = {str(p.saga_id): sagas.get(conn, ORDER_SAGA.table, p.saga_id) for p in placed}
    assert {r[1]: (r[0], r[2:]) for r in rows} == {
        saga_id: (utc(row.started_at), ["running", "charge_payment", "1", "-"])
        for saga_id, row in started.items()
        if row is not None
    }
    assert ok(env, "orders", "list", "--status", "cancelled").strip() == "no orders"
    # --json keeps its fields and formats, which scripts read.
    listed = json.loads(ok(env, "sagas", "list", "--json"))
    assert {r["saga_id"] for r in listed} == set(started) and "started_at" in listed[0]


def test_sagas_show_dates_every_time_and_heads_its_timeline(env: dict[str, str], runtime: Runtime, conn) -> None:
    placed = place(runtime, "c1", "sku1", 1, 100)
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.abort(tx, placed.saga_id, "customer called")
    row = sagas.get(conn, ORDER_SAGA.table, placed.saga_id)
    assert row is not None
    text = ok(env, "sagas", "show", str(placed.saga_id))
    assert f"waiting since {utc(row.updated_at)}, attempt 1, deadline {utc(row.deadline_at)}" in text
    header, rows = table(text, "AT")
    assert header[:5] == ["AT", "VERSION", "EVENT", "STATUS", "STEP"]
    timeline = sagas.timeline(conn, ORDER_SAGA.table, placed.saga_id)
    assert [r[:3] for r in rows] == [[utc(e.at, precise=True), str(e.version), e.event] for e in timeline]


_PLACE = ("orders", "place", "--customer", "c1", "--customer", "c2", "--sku", "sku1", "--amount", "700")


def _placed_lines(env: dict[str, str], *args: str) -> list[str]:
    return ok(env, *_PLACE, *args).splitlines()


def test_orders_place_count_prints_one_summary_line_and_each_order_under_verbose(env: dict[str, str], conn) -> None:
    (line,) = _placed_lines(env, "--count", "30")
    orders = [r[0] for r in conn.execute("SELECT order_id::text FROM orders.orders ORDER BY created_at, order_id")]
    assert len(orders) == 30
    found = re.fullmatch(r"placed 30 orders in [\d.]+ s \([\d,]+ orders/s\): first order (\S+), last order (\S+)", line)
    assert found is not None, line
    assert {found[1], found[2]} <= set(orders) and found[1] != found[2]

    (one,) = _placed_lines(env, "--idempotency-key", "K")
    (again,) = _placed_lines(env, "--idempotency-key", "K")
    saga_id = scalar(conn, "SELECT saga_id::text FROM orders.saga_order ORDER BY started_at DESC LIMIT 1")
    order_id = scalar(conn, "SELECT order_id::text FROM orders.orders WHERE idempotency_key = 'K'")
    assert re.fullmatch(rf"placed 1 order in [\d.]+ s: order {order_id}, saga {saga_id}", one), one
    assert again.startswith("placed 0 orders, 1 already placed (same key), in ")

    verbose = _placed_lines(env, "--count", "3", "-v")
    assert len(verbose) == 4 and verbose[-1].startswith("placed 3 orders in ")
    assert all(re.fullmatch(r"order \S+ saga \S+ placed", v) for v in verbose[:3]), verbose
    # --json is as it was: every order, with its saga and whether this call placed it.
    placed = json.loads(ok(env, *_PLACE, "--count", "2", "--json"))
    assert [sorted(p) for p in placed] == [["order_id", "placed", "saga_id"]] * 2


def test_the_outbox_commands_print_a_header_and_utc_dates(env: dict[str, str], conn) -> None:
    message_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message_type, message, available_at)"
        " VALUES (%s, 'pingpong', 'pingpong.ping', 'estafeta_actors.pingpong.Ping', '{}'::jsonb,"
        " now() + interval '1 hour')",
        (message_id,),
    )
    due, written = conn.execute("SELECT available_at, created_at FROM pingpong.outbox").fetchone()
    header, rows = table(ok(env, "outbox", "stats"), "SERVICE")
    assert header == ["SERVICE", "PENDING", "FAILED", "RETRYING", "DELAYED", "BLOCKED KEYS", "OLDEST WAIT (S)"]
    assert ["pingpong", "1", "0", "0", "1", "0"] in [r[:6] for r in rows]

    header, rows = table(ok(env, "outbox", "stats", "--by-type"), "SERVICE")
    assert header == ["SERVICE", "TYPE", "PENDING", "FAILED", "OLDEST"]
    assert rows == [["pingpong", "estafeta_actors.pingpong.Ping", "1", "0", utc(written)]]

    header, rows = table(ok(env, "outbox", "scheduled"), "DUE")
    assert header == ["DUE", "SERVICE", "MESSAGE ID", "TYPE"]
    assert rows == [[utc(due), "pingpong", str(message_id), "estafeta_actors.pingpong.Ping"]]

    letter = park(conn, "payments.charge_payment", {})
    parked = scalar(conn, "SELECT created_at FROM payments.dead_letters WHERE id = %s", letter)
    header, rows = table(ok(env, "outbox", "dead-letters"), "SERVICE")
    assert header == ["SERVICE", "ID", "PARKED", "REASON"]
    assert rows == [["payments", str(letter), utc(parked), "failed 4 times, last: OSError: disk full"]]


def test_the_dead_letter_commands_print_a_header_and_utc_dates(env: dict[str, str], conn) -> None:
    letters = [park(conn, "payments.charge_payment", {}) for _ in range(2)]
    parked = dict(conn.execute("SELECT id, created_at FROM payments.dead_letters").fetchall())
    header, rows = table(ok(env, "dead-letters", "list"), "SERVICE")
    assert header == ["SERVICE", "ID", "PARKED", "STATUS", "GROUP", "REASON"]
    assert sorted((r[1], r[2], r[3]) for r in rows) == [(str(i), utc(parked[i]), "parked") for i in letters]

    header, rows = table(ok(env, "dead-letters", "groups"), "GROUP")
    assert header == ["GROUP", "COUNT", "STEP", "FIRST", "LAST", "CAUSE"]
    ((_, count, step, first, last, cause),) = rows
    assert (count, step) == ("2", "payments.charge_payment")
    assert (first, last) == (utc(parked[letters[0]]), utc(parked[letters[1]]))
    assert cause.startswith("OSError: ")

    shown = ok(env, "dead-letters", "show", str(letters[0]))
    assert f"dead letter payments #{letters[0]}: parked, parked {utc(parked[letters[0]])}" in shown


def test_projections_status_and_events_show_print_a_header_and_utc_dates(
    env: dict[str, str], runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    projector = Projector(OrderSummary(), STORE)
    projector.create_tables(conn)
    placed = place(runtime, "c1", "sku1", 1, 100)
    catch_up(conn, projector)
    header, rows = table(ok(env, "projections", "status", "--service", "orders"), "PROJECTION")
    assert header == ["PROJECTION", "STATE", "POSITION", "LAG (EVENTS)", "LAG (S)", "ERROR"]
    assert [r[0] for r in rows] == ["orders.order_summary"] and rows[0][3:5] == ["0", "0.0"]

    text = ok(env, "events", "show", f"order-{placed.order_id}", "--service", "orders")
    header, rows = table(text, "VERSION")
    assert header == ["VERSION", "POSITION", "RECORDED", "TYPE", "DATA"]
    recorded = scalar(conn, "SELECT recorded_at FROM orders.events WHERE stream_id = %s", f"order-{placed.order_id}")
    ((version, _, at, kind, data),) = rows
    assert (version, at, kind) == ("1", utc(recorded, precise=True), "OrderPlaced")
    assert json.loads(data) == {"customer_id": "c1", "sku": "sku1", "quantity": 1, "amount_cents": 100}


def test_status_prints_when_each_process_started_in_utc(env: dict[str, str], runtime: Runtime, conn) -> None:
    with Heartbeat([Role(Kind.RELAY, {"orders": ["orders"]})], runtime.database, interval=60):
        started = scalar(conn, "SELECT started_at FROM orders.heartbeats")
        header, rows = table(ok(env, "status"), "SERVICE")
    assert header[6:8] == ["STARTED", "LAST BEAT"]
    assert [(r[0], r[1], r[6]) for r in rows] == [("orders", "relay", utc(started))]


def test_schedules_list_prints_utc_dates(database_url: str, runtime: Runtime) -> None:
    from .ticker import app

    env = {**service_env(database_url, "stub://", PGTZ=SESSION_ZONE), "ESTAFETA_APP": "tests.ticker"}
    schedule = app.schedule("slow")
    scheduler = Scheduler(runtime, [schedule])
    scheduler.set_paused(schedule, paused=True)
    scheduler.set_paused(schedule, paused=False)
    (state,) = [s.as_dict() for s in scheduler.states()]
    text = ok(env, "schedules", "list")
    assert f"ticker.slow  every 0:05:00  (overlap skip, catch-up all)  next {utc(state['next_fire_at'])}" in text
    assert f"last outcome {utc(state['last_outcome_at'])}: resumed by an operator" in text
