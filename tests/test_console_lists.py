"""The console's lists, over HTTP on a real PostgreSQL: filters, keyset pages, links from counts, index plans."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg.types.json import Jsonb

from estafeta import Runtime
from estafeta_actors.app import app as order_system
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_console.server.web import WebOptions, create_app
from estafeta_sql import saga_reports

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STEPS = ["charge_payment", "reserve_inventory", "confirm_order", "notify_customer"]
STATUSES = ["running", "completed", "compensated", "failed"]


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    """The console of the order system, in process (no actions: it only reads)."""
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


def add_sagas(conn: psycopg.Connection[Any], count: int) -> list[dict[str, Any]]:
    """``count`` order sagas, one a minute from T0, cycling through statuses and steps.

    The 73rd and 74th share a start: with 123 sagas, the first page (the newest 50) ends
    between them, so the cursor must order by saga id too to lose neither.
    """
    made = []
    with conn.cursor() as cur:
        for n in range(count):
            started = T0 + timedelta(minutes=73 if n == 72 else n)
            status, step = STATUSES[n % 4], STEPS[n % 3]
            error = f"payment declined 100% for order {n}" if status == "failed" else None
            saga_id = uuid.UUID(int=n + 1)
            cur.execute(
                "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout,"
                " started_at, last_error) VALUES (%s, %s, %s, %s, %s, '30 s', %s, %s)",
                (saga_id, uuid.uuid4(), status, step, Jsonb({}), started, error),
            )
            made.append({"saga_id": str(saga_id), "status": status, "step": step, "started": started, "error": error})
    return made


def newest_first(rows: list[dict[str, Any]]) -> list[str]:
    return [r["saga_id"] for r in sorted(rows, key=lambda r: (r["started"], r["saga_id"]), reverse=True)]


def listed(console: TestClient, url: str) -> tuple[list[str], str | None]:
    """The saga ids a list page shows, in order, and its next page's URL."""
    page = console.get(url)
    assert page.status_code == 200, page.text
    section = page.text.split('id="saga-list"', 1)[1].split("</section>", 1)[0]
    found = re.search(r'id="next-page" href="([^"]+)"', page.text)
    return re.findall(r'<tr id="saga-([0-9a-f-]+)">', section), found.group(1).replace("&amp;", "&") if found else None


def every_page(console: TestClient, url: str) -> list[str]:
    ids: list[str] = []
    next_url: str | None = url
    while next_url:
        assert len(ids) < 1000, "the pages never end"
        page, next_url = listed(console, next_url)
        assert "OFFSET" not in (next_url or "")
        ids += page
    return ids


def test_the_saga_list_pages_newest_first_with_a_cursor_and_loses_or_repeats_nothing(console, conn) -> None:
    made = add_sagas(conn, 123)
    first, next_url = listed(console, "/console/sagas")
    assert len(first) == 50 and next_url is not None and "after=" in next_url
    # A saga started after the first page was read does not shift the next pages.
    add_sagas_after = uuid.uuid4()
    conn.execute(
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout)"
        " VALUES (%s, %s, 'running', 'charge_payment', '{}', '30 s')",
        (add_sagas_after, uuid.uuid4()),
    )
    rest = every_page(console, next_url)
    assert first + rest == newest_first(made)


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("kind=order&status=failed", lambda r: r["status"] == "failed"),
        ("step=confirm_order", lambda r: r["step"] == "confirm_order"),
        ("status=running&step=charge_payment", lambda r: r["status"] == "running" and r["step"] == "charge_payment"),
        (
            "since=2026-11-30T12:10&until=2026-11-30T12:40:00%2B00:00",
            lambda r: T0 + timedelta(minutes=10) <= r["started"] < T0 + timedelta(minutes=40),
        ),
        # Taken literally: % is no wildcard, and case does not matter.
        ("error=DECLINED 100%25 for order 1", lambda r: r["error"] and "declined 100% for order 1" in r["error"]),
    ],
)
def test_each_filter_lists_exactly_the_sagas_it_names(console, conn, query: str, keep: Any) -> None:
    made = add_sagas(conn, 123)
    expected = newest_first([r for r in made if keep(r)])
    assert expected
    assert every_page(console, f"/console/sagas?{query}") == expected


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("kind=nope", "kind: no saga kind 'nope' (this app has: order)"),
        ("status=lost", "status: 'lost' is not one of running, compensating, gave_up, completed, compensated, failed"),
        ("step=fly", "step: no step 'fly' in any saga kind"),
        ("kind=order&step=fly", "step: no step 'fly' in the order saga"),
        ("since=yesterday", "since: 'yesterday' is not a time"),
        ("since=2026-12-02&until=2026-12-01", "since: must be before until"),
        ("after=2026-12-01T00:00:00%2B00:00,not-a-uuid", "after: not a cursor of this console"),
        ("after=2026-12-01T00:00:00,00000000-0000-0000-0000-000000000001", "after: not a cursor of this console"),
        ("error=" + "x" * 201, "error: longer than 200 characters"),
    ],
)
def test_a_bad_filter_is_a_400_saying_which_and_why_in_one_line(console, query: str, says: str) -> None:
    answer = console.get(f"/console/sagas?{query}")
    assert answer.status_code == 400
    reason = re.search(r'<p class="bad" id="reason">(.*?)</p>', answer.text, re.S)
    assert reason and says in reason.group(1).replace("&#39;", "'") and "\n" not in reason.group(1)


def test_every_saga_count_on_the_overview_links_to_the_list_it_counts(console, conn) -> None:
    made = add_sagas(conn, 123)
    overview = console.get("/console").text
    links = re.findall(r'<a href="(/console/sagas\?kind=order&amp;status=(\w+))">(\d+)</a>', overview)
    assert sorted(status for _, status, _ in links) == sorted(
        ["running", "compensating", "gave_up", "completed", "compensated", "failed"]
    )
    for href, status, count in links:
        ids = every_page(console, href.replace("&amp;", "&"))
        assert len(ids) == int(count) == sum(r["status"] == status for r in made)
        assert ids == newest_first([r for r in made if r["status"] == status])
    # Each row links to its saga's page.
    saga_id = newest_first(made)[0]
    assert f'href="/console/sagas/{saga_id}"' in console.get("/console/sagas").text
    assert console.get(f"/console/sagas/{saga_id}").status_code == 200


def test_each_node_of_a_kind_diagram_links_to_a_list_the_console_serves(console) -> None:
    page = console.get("/console/kinds/order").text
    links = re.findall(r'<a href="(/console/sagas\?[^"]+)"><g class="node', page)
    assert len(links) == 11
    assert all(console.get(link.replace("&amp;", "&")).status_code == 200 for link in links)


def test_a_dead_letter_count_links_to_its_group_with_bodies_reasons_and_replay_history(console, conn) -> None:
    for n, status in enumerate(["parked", "parked", "replayed"]):
        conn.execute(
            "INSERT INTO payments.dead_letters (consumer, message_id, message, reason, status, replayed_as)"
            " VALUES ('payments.charge_payment', %s, %s, %s, %s, %s)",
            (
                str(uuid.uuid4()),
                Jsonb({"args": [{"customer_id": f"<script>c{n}</script>"}]}),
                f"failed 4 times, last: OSError: disk full {n}",
                status,
                uuid.uuid4() if status == "replayed" else None,
            ),
        )
    overview = console.get("/console").text
    (href,) = re.findall(r'<a href="(/console/dead-letters/payments/[^"]+)">2</a>', overview)
    page = console.get(href).text
    parked, history = page.split('id="history"')
    assert parked.count('<tr id="letter-') == 2 and history.count('<tr id="letter-') == 1
    assert "&lt;script&gt;c0&lt;/script&gt;" in parked and page.count("<script>") == 1  # escaped; the clock alone
    assert "OSError: disk full 1" in parked and "replayed" in history
    assert console.get("/console/dead-letters/payments/nothing").status_code == 404
    assert console.get("/console/dead-letters/nowhere/x").status_code == 400


def test_the_failed_outbox_count_links_to_the_rows_with_their_messages(console, conn) -> None:
    conn.execute(
        "INSERT INTO orders.outbox (message_id, queue_name, actor_name, message, status, attempts, last_error)"
        " VALUES (%s, 'payments', 'payments.charge_payment', %s, 'failed', 5, 'connection refused')",
        (uuid.uuid4(), Jsonb({"args": [{"amount_cents": 4242}]})),
    )
    overview = console.get("/console").text
    assert '<a href="/console/outbox/failed?service=orders">1</a>' in overview
    page = console.get("/console/outbox/failed?service=orders").text
    assert "&#34;amount_cents&#34;: 4242" in page and "connection refused" in page
    assert console.get("/console/outbox/failed?service=nowhere").status_code == 400


#: Every filter the list serves, as the console builds them.
FILTERS = [
    saga_reports.ListFilter(),
    saga_reports.ListFilter(status="failed"),
    saga_reports.ListFilter(step="confirm_order"),
    saga_reports.ListFilter(status="running", step="charge_payment"),
    saga_reports.ListFilter(since=T0, until=T0 + timedelta(hours=1)),
    saga_reports.ListFilter(error="disk"),
    saga_reports.ListFilter(status="compensated", after=(T0 + timedelta(days=2), uuid.UUID(int=7))),
]


def test_a_list_page_walks_an_index_never_the_whole_saga_table(conn, runtime: Runtime) -> None:
    # Enough rows, skewed as a real table is (most sagas completed, few failed, few waiting
    # on one step), for the planner to weigh a scan of the table against an index.
    conn.execute(
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout, started_at,"
        " last_error) SELECT gen_random_uuid(), gen_random_uuid(),"
        " CASE WHEN mod(n, 500) = 0 THEN 'failed' WHEN mod(n, 250) = 5 THEN 'running'"
        "      WHEN mod(n, 50) = 3 THEN 'compensated' ELSE 'completed' END,"
        " CASE WHEN mod(n, 400) = 1 THEN 'confirm_order' WHEN mod(n, 7) = 0 THEN 'charge_payment'"
        "      ELSE 'notify_customer' END, '{}', '30 s',"
        " %s + n * interval '1 second', CASE WHEN mod(n, 500) = 0 THEN 'disk full' END"
        " FROM generate_series(1, 50000) AS n",
        (T0,),
    )
    conn.execute("ANALYZE orders.saga_order")
    for where in FILTERS:
        statement = saga_reports.list_query(ORDER_SAGA.table, where).as_string(conn)
        rows = conn.execute(f"EXPLAIN {statement}", saga_reports.list_params(where, 51)).fetchall()
        plan = f"{where}:\n" + "\n".join(str(line[0]) for line in rows)
        # No scan of the table: one of the list's indexes (sql/migrations/_saga/0002_list_indexes.sql)
        # serves the filter (walked newest first, or a few entries of it sorted).
        assert "Seq Scan" not in plan, plan
        found = re.search(r"(Index Scan Backward using|Bitmap Index Scan on) saga_order_(status_|step_)?newest", plan)
        assert found, plan
