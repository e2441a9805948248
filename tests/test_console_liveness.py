"""The console's front page shows which processes serve each service, stale and missing ones in red."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from estafeta import Runtime
from estafeta.observability.heartbeats import Heartbeat, Kind, Role
from estafeta_actors.app import app as order_system
from estafeta_console.server.web import WebOptions, create_app
from estafeta_sql import clock


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    """The order system's console, in process."""
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


def section(console: TestClient) -> str:
    page = console.get("/console")
    assert page.status_code == 200, page.text
    return page.text.split('id="processes"', 1)[1].split("</section>", 1)[0]


def test_an_outbox_with_pending_rows_and_no_relay_is_red_and_a_live_relay_is_listed(
    console: TestClient, runtime: Runtime, conn
) -> None:
    conn.execute(
        "INSERT INTO orders.outbox (message_id, queue_name, actor_name, message) "
        "VALUES (gen_random_uuid(), 'payments', 'payments.charge', '{}'::jsonb)"
    )
    html = section(console)
    assert "outbox orders: 1 pending row(s) and no live relay" in html
    assert "no process has a heartbeat" in html

    with Heartbeat([Role(Kind.RELAY, {"orders": ["orders"]}, threads=2)], runtime.database, interval=60):
        html = section(console)
        assert "no live relay" not in html.split("<td>orders</td>", 1)[1].split("</tr>", 1)[0]
        assert re.search(r"<tr>\s*<td>orders</td><td>relay</td><td>orders</td>", html)
        assert '<span class="badge ok">live</span>' in html


def test_a_stale_heartbeat_is_a_red_row(console: TestClient, runtime: Runtime, conn) -> None:
    Heartbeat([Role(Kind.WORKER, {"orders": ["orders"]})], runtime.database, interval=1).beat_once()
    try:
        clock.advance(conn, "orders", timedelta(seconds=10))
        html = section(console)
    finally:
        clock.reset(conn, "orders")
    assert re.search(r'<tr class="bad">\s*<td>orders</td><td>worker</td>', html)
    assert '<span class="badge bad">stale</span>' in html
    assert "queue orders: no live worker consuming it" in html
