"""The console's charts: known rows drawn as known points, axes, escaped labels, the window checked, the frame."""

from __future__ import annotations

import json
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from psycopg.types.json import Jsonb

from estafeta import Runtime
from estafeta_actors.app import app as order_system
from estafeta_console import charts as console_charts
from estafeta_console.charts import Axis, BadWindow, parse_window
from estafeta_console.server.web import WebOptions, create_app

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


def points(svg: ET.Element, series: str) -> dict[int, str]:
    """Bucket -> value of each point drawn for ``series`` (buckets with nothing have none)."""
    group = next(g for g in svg.iter(f"{SVG}g") if g.get("data-series") == series)
    return {int(c.get("data-bucket", "")): c.get("data-value", "") for c in group.iter(f"{SVG}circle")}


def drawn(app_charts: list[console_charts.Chart], chart_id: str) -> tuple[console_charts.Chart, ET.Element]:
    chart = next(c for c in app_charts if c.id == chart_id)
    return chart, ET.fromstring(str(console_charts.render(chart)))


@pytest.mark.parametrize(
    ("text", "minutes"), [(None, 60), ("", 60), ("90", 90), ("90m", 90), (" 3h ", 180), ("5", 5), ("24h", 1440)]
)
def test_a_window_is_minutes_or_hours(text: str | None, minutes: int) -> None:
    assert parse_window(text) == minutes


@pytest.mark.parametrize(
    ("text", "why"),
    [("abc", "not a number"), ("4", "between 5 min and 24 h"), ("25h", "between"), ("-5", "not a number")],
)
def test_a_bad_window_is_refused_in_one_line(text: str, why: str) -> None:
    with pytest.raises(BadWindow, match=why) as refused:
        parse_window(text)
    assert "\n" not in str(refused.value) and f"window={text!r}" in str(refused.value)


def test_a_long_window_has_buckets_of_several_minutes() -> None:
    now = datetime.fromisoformat("2026-12-01T17:30:42+00:00")
    assert Axis.ending(now, 60) == Axis(datetime.fromisoformat("2026-12-01T16:31:00+00:00"), 1, 60)
    day = Axis.ending(now, 1440)
    assert (day.minutes, day.count, day.end) == (24, 60, datetime.fromisoformat("2026-12-01T17:31:00+00:00"))


def test_known_rows_are_drawn_as_their_counts_per_minute(
    runtime: Runtime, conn: psycopg.Connection[Any], console: TestClient
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    axis = Axis.ending(now, 60)

    def at(bucket: int) -> datetime:
        return axis.at(bucket) + timedelta(seconds=20)

    def saga(started: datetime, status: str = "running", ended: datetime | None = None) -> None:
        conn.execute(
            "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout,"
            " started_at, completed_at) VALUES (%s, %s, %s, 'charge_payment', %s, '30 s', %s, %s)",
            (uuid.uuid4(), uuid.uuid4(), status, Jsonb({}), started, ended),
        )

    for _ in range(3):
        saga(at(50))
    saga(at(51), "completed", at(55))
    saga(at(52), "completed", at(55))
    saga(at(52), "compensated", at(57))
    saga(axis.start - timedelta(minutes=5), "completed", axis.start - timedelta(minutes=1))  # before the window
    for bucket in (10, 10, 30):
        conn.execute(
            "INSERT INTO payments.outbox (message_id, queue_name, actor_name, message, created_at)"
            " VALUES (%s, 'q', 'a', '{}', %s)",
            (uuid.uuid4(), at(bucket)),
        )
    for n in (17, 18):
        conn.execute(
            "INSERT INTO payments.dead_letters (consumer, message_id, message, reason, created_at)"
            " VALUES ('payments.charge_payment', %s, '{}', %s, %s)",
            (str(uuid.uuid4()), f"not a valid ChargePayment: amount {n} <b>x</b>", at(5)),
        )

    charts = console_charts.read_charts(order_system, runtime, 60, now)
    chart, svg = drawn(charts, "sagas")
    assert points(svg, "started") == {50: "3", 51: "1", 52: "2"}
    assert points(svg, "completed") == {55: "2"}
    assert points(svg, "compensated") == {57: "1"}
    # Axes: 0 and a round top above the largest count, and the times of the window (UTC).
    y_labels = [t.text for t in svg.iterfind(f".//{SVG}g[@class='axis y']/{SVG}text")]
    assert y_labels == ["0", "2.5", "5"]
    x_labels = [t.text for t in svg.iterfind(f".//{SVG}g[@class='axis x']/{SVG}text")]
    assert x_labels[0] == axis.start.strftime("%H:%M") and x_labels[-1] == "UTC"
    assert svg.find(f"{SVG}text[@class='title']").text == chart.title  # type: ignore[union-attr]

    _, backlog = drawn(charts, "outbox-backlog")
    payments = points(backlog, "payments")
    assert 9 not in payments and [payments[b] for b in (10, 29, 30, 59)] == ["2", "2", "3", "3"]
    assert points(backlog, "orders") == {}
    _, oldest = drawn(charts, "outbox-oldest")
    assert oldest.find(f".//{SVG}g[@data-series='payments']") is not None
    assert float(points(oldest, "payments")[59]) == pytest.approx(
        round((axis.end - at(10)).total_seconds() / 60, 1), abs=0.1
    )

    chart, letters = drawn(charts, "dead-letters")
    name = "payments.charge_payment InvalidMessage: not a valid ChargePayment: amount <n> <b>x</b>"
    assert [s.name for s in chart.series] == [name]
    assert points(letters, name) == {5: "2"}
    raw = str(console_charts.render(chart))
    assert "&lt;b&gt;x&lt;/b&gt;" in raw and "<b>" not in raw  # escaped, so parsing above did not see a <b>

    # Over HTTP: the page frames the charts; the frame redraws itself; a bad window is a 400 in one line.
    page = console.get("/console/charts?window=90")
    assert page.status_code == 200 and 'src="/console/charts/frame?window=90"' in page.text
    assert "frame-src 'self'" in page.headers["content-security-policy"]
    # No script but the console's clock, allowed by its hash (no 'unsafe-inline', nothing loaded).
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'(;|$)", page.headers["content-security-policy"])
    frame = console.get("/console/charts/frame?window=90")
    assert frame.status_code == 200 and '<meta http-equiv="refresh"' in frame.text
    assert "frame-ancestors 'self'" in frame.headers["content-security-policy"]
    assert frame.text.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 4
    for url in ("/console/charts?window=soon", "/console/charts/frame?window=3000"):
        refused = console.get(url)
        assert refused.status_code == 400
        assert 'id="reason">window=' in refused.text


def test_the_sagas_that_ended_in_a_window_are_read_through_their_index(
    runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    # 50,000 sagas over three days, ended two seconds after they started (a few still running).
    conn.execute(
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout,"
        " started_at, completed_at)"
        " SELECT gen_random_uuid(), gen_random_uuid(),"
        "  CASE WHEN mod(n, 50) = 3 THEN 'compensated' WHEN mod(n, 500) = 5 THEN 'running' ELSE 'completed' END,"
        "  'notify_customer', '{}', '30 s', now() - n * interval '5 s',"
        "  CASE WHEN mod(n, 500) = 5 THEN NULL ELSE now() - n * interval '5 s' + interval '2 s' END"
        " FROM generate_series(1, 50000) AS n"
    )
    conn.execute("ANALYZE orders.saga_order")
    axis = Axis.ending(conn.execute("SELECT now()").fetchone()[0], 60)  # type: ignore[index]
    table = sql.Identifier("orders", "saga_order")
    statement = console_charts.bucket_query(table, "completed_at", extra=", status", where=console_charts.ENDED)
    plan = json.dumps(
        conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, console_charts.bucket_params(axis)).fetchone()
    )
    assert "saga_order_ended" in plan and "Seq Scan" not in plan
    counted = conn.execute(statement, console_charts.bucket_params(axis)).fetchall()
    assert 600 < sum(count for _, _, count in counted) < 720  # about 12 a minute over the hour
