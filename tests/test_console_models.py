"""The console's read models (projections, event streams, scheduled messages) and its readable times and labels.

In process (FastAPI's test client) on real PostgreSQL, with the order system's real
sagas run by the courier; the same pages in Chromium are in tests/integration/test_console.py.
"""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from estafeta import Projector, Runtime
from estafeta.events.projection_ops import observe_batch
from estafeta_actors.app import app as order_system
from estafeta_actors.order_events import STORE, stream_id
from estafeta_actors.order_history import OrderSummary
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_console import saga_labels
from estafeta_console.data import overview as console_data
from estafeta_console.server.web import WebOptions, create_app
from estafeta_sql import projection_store

from .integration.processes import service_env
from .shop import Courier, place, seed
from .test_cli import run

pytestmark = pytest.mark.integration


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    """The console of the order system, in process (no actions: it only reads)."""
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


def rows(page: str, table: str) -> list[str]:
    """The rows (``<tr id=...>``) of the table with id ``table``, as their raw HTML."""
    body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr id=.*?</tr>", body, flags=re.S)


def test_a_compensated_saga_names_each_compensation_by_the_command_it_sends(
    console: TestClient, runtime: Runtime, conn: psycopg.Connection[Any], database_url: str
) -> None:
    seed(runtime, {"c1": 100}, {"s1": 5})
    refused = place(runtime, "c1", "s1", 1, 3_000)  # not enough money: compensated
    Courier(runtime, conn).run()
    page = console.get(f"/console/sagas/{refused.saga_id}").text
    details = re.findall(r'<td class="detail">([^<]*)</td>', page)
    # The step after compensation sends the cancellation notice: it is never "undone".
    assert "notify_cancellation done after compensating (sent NotifyCustomer)" in details
    assert "place_order compensated by CancelOrder" in details
    assert not any(d.endswith(" undone") for d in details)
    # The diagram says what each compensation sends, from the declaration alone.
    kind = console.get("/console/kinds/order").text
    assert "sends CancelOrder" in kind and "sends RefundPayment" in kind and "sends NotifyCustomer" in kind
    assert '<span class="badge muted">compensated</span>' in page
    # `estafeta sagas show` says the same.
    shown = run(service_env(database_url, "stub://"), "sagas", "show", str(refused.saga_id))
    assert shown.returncode == 0, shown.stderr
    assert "place_order compensated by CancelOrder" in shown.stdout
    assert "notify_cancellation done after compensating (sent NotifyCustomer)" in shown.stdout


def test_labels_fall_back_to_the_declaration_when_the_state_cannot_build_the_command() -> None:
    undo = next(s for s in ORDER_SAGA.steps if s.name == "charge_payment")
    assert saga_labels.command_name(undo.compensation) == "RefundPayment"  # read from its code

    def cancel_everything(state: Any) -> Any:
        raise RuntimeError("old data")

    assert saga_labels.command_name(cancel_everything, state=object()) == "cancel_everything"  # type: ignore[arg-type]
    assert saga_labels.command_name(None) is None


def test_times_are_time_elements_in_utc_with_their_age_and_the_clock_script_is_the_only_one_allowed(
    console: TestClient,
) -> None:
    at = datetime.now(UTC) - timedelta(minutes=3, seconds=5)
    drawn = str(console_data.when(at))
    assert drawn.startswith(f'<time datetime="{at.isoformat()}"')
    assert f"{at:%Y-%m-%d %H:%M:%S} UTC · 3 min ago</time>" in drawn
    assert str(console_data.when(None)) == "—"
    assert str(console_data.badge("failed<x>")) == '<span class="badge muted">failed&lt;x&gt;</span>'
    page = console.get("/console")
    (script,) = re.findall(r"<script>(.*?)</script>", page.text, flags=re.S)
    assert script == console_data.CLOCK_SCRIPT
    assert f"script-src {console_data.SCRIPT_HASH}" in page.headers["content-security-policy"]


def test_the_projections_page_shows_position_lag_state_error_and_the_oldest_open_writer(
    console: TestClient, runtime: Runtime, conn: psycopg.Connection[Any], database_url: str
) -> None:
    page = console.get("/console/projections").text
    (line,) = rows(page, "projections")
    assert "order_summary" in line and "not started" in line and "estafeta projections run" in line

    projector = Projector(OrderSummary(), STORE)
    projector.create_tables(conn)
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    place(runtime, "c1", "s1", 1, 3_000)
    observe_batch(projector, projector.run_batch(conn))
    with psycopg.connect(database_url, autocommit=False, application_name="slow-writer") as writer:
        writer.execute("CREATE TEMP TABLE hold (x int); INSERT INTO hold VALUES (1)")
        writer.execute("SELECT pg_current_xact_id()")
        projection_store.mark_failed(conn, "orders", OrderSummary.name, error="boom: bad event", position=7)
        page = console.get("/console/projections").text
        overview = console.get("/console").text
        writer.rollback()
    # The overview counts them too, each linking to its line.
    models = overview.split('id="read-models"', 1)[1].split("</section>", 1)[0]
    assert 'href="/console/projections#projection-orders-order_summary"' in models
    assert '<span class="badge bad">failed</span>' in models and "boom: bad event" in models
    (line,) = rows(page, "projections")
    assert '<span class="badge bad">failed</span>' in line
    assert "at position 7: boom: bad event" in line
    # Our writer is open, so the server has an oldest one (ours, or an older one of another run).
    writers = page.split('id="oldest-writer"', 1)[1]
    assert re.search(r'<p class="writer">On the server of orders, [^:]*: pid \d+', writers), writers
    assert "Every projection there waits for it" in writers


def test_the_event_browser_shows_a_stream_as_of_a_version_or_a_time_and_refuses_bad_values(
    console: TestClient, runtime: Runtime
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 1, 3_000)
    stream = stream_id(placed.order_id)
    front = console.get("/console/events").text
    assert f'stream={stream}"' in front.replace("&amp;", "&") or stream in front  # written last

    whole = console.get("/console/events", params={"service": "orders", "stream": stream}).text
    assert len(rows(whole, "events")) >= 1 and "OrderPlaced" in whole
    first = console.get("/console/events", params={"service": "orders", "stream": stream, "version": "1"}).text
    assert len(rows(first, "events")) == 1
    before = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    empty = console.get("/console/events", params={"service": "orders", "stream": stream, "as_of": before}).text
    assert rows(empty, "events") == [] and "has no event in orders at that point" in empty

    # A stream whose aggregate the service declares shows the state its events make, as the CLI does.
    account = console.get("/console/events", params={"service": "payments", "stream": "account-c1"}).text
    assert "AccountOpened" in account and '<pre id="state"' in account and "balance" in account

    for params, why in [
        ({"stream": stream, "service": "orders", "version": "0"}, "version: '0' is not a version"),
        ({"stream": stream, "service": "orders", "as_of": "yesterday"}, "as_of: 'yesterday' is not an ISO 8601 time"),
        ({"stream": stream, "service": "orders", "as_of": before, "version": "1"}, "give one, not both"),
        ({"stream": stream, "service": "inventory"}, "service: 'inventory' has no event store"),
        ({"stream": "x" * 501, "service": "orders"}, "stream: longer than 500 characters"),
    ]:
        refused = console.get("/console/events", params=params)
        assert refused.status_code == 400 and why in html.unescape(refused.text), params


def test_scheduled_messages_are_listed_soonest_first(console: TestClient, runtime: Runtime) -> None:
    from estafeta_actors.payments import ChargePayment

    later, sooner = (datetime.now(UTC) + timedelta(hours=h) for h in (5, 2))
    ids = []
    with runtime.database("orders").transaction() as conn:
        for at in (later, sooner):
            command = ChargePayment(uuid.uuid4(), "c1", 100)
            ids.append(order_system.service("orders").send(conn, command, at=at))
    page = console.get("/console/outbox/scheduled").text
    assert re.search(
        r'<p id="scheduled-count">[^<]*<a href="/console/outbox/scheduled">2</a>', console.get("/console").text
    )
    assert [m for m in re.findall(r'<tr id="message-([0-9a-f-]+)"', page)] == [str(ids[1]), str(ids[0])]
    assert "ChargePayment" in page and f'datetime="{sooner.isoformat()}"' in page
