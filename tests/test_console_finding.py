"""Finding and fixing one order in the console, over HTTP in process on a real PostgreSQL.

Finding a saga by its id, its order id or their first characters; the stuck sagas' list;
the dead-letter groups, a group a page at a time, and a replay that shows its dry run and
asks for the count; a saga's timeline and diagram saying which step failed; a kind's
diagram counting the sagas on each step. The same pages in Chromium are in
tests/integration/test_console_finding.py.
"""

from __future__ import annotations

import base64
import html
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg.types.json import Jsonb

from estafeta import Runtime
from estafeta_actors.app import app as order_system
from estafeta_console.server.web import WebOptions, create_app

from .integration.processes import service_env
from .shop import Courier, place, seed
from .test_cli import run

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


@pytest.fixture
def console(runtime: Runtime) -> Iterator[TestClient]:
    """The console of the order system, in process (no actions: it only reads)."""
    with TestClient(create_app(order_system, runtime, WebOptions())) as client:
        yield client


@pytest.fixture
def acting(runtime: Runtime) -> Iterator[TestClient]:
    """The console with its actions, signed in as the operator."""
    options = WebOptions(allow_actions=True, console_password=PASSWORD)
    signed_in = {"Authorization": "Basic " + base64.b64encode(f"operator:{PASSWORD}".encode()).decode()}
    with TestClient(create_app(order_system, runtime, options), headers=signed_in) as client:
        yield client


def add_saga(conn: psycopg.Connection[Any], saga_id: uuid.UUID, order_id: uuid.UUID, *, stuck: bool = False) -> None:
    """An order saga waiting on charge_payment; ``stuck``: its deadline passed a minute ago."""
    conn.execute(
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout, deadline_at)"
        " VALUES (%s, %s, 'running', 'charge_payment', %s, '30 s',"
        " now() + CASE WHEN %s THEN interval '-1 minute' ELSE interval '1 hour' END)",
        (saga_id, order_id, Jsonb({}), stuck),
    )


def saga_ids(page: str, section: str) -> list[str]:
    body = page.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<tr id="saga-([0-9a-f-]+)">', body)


def test_a_saga_is_found_by_its_id_its_order_id_or_their_first_characters(console: TestClient, conn) -> None:
    one, two = uuid.UUID("1a2b3c4d-0000-4000-8000-000000000001"), uuid.UUID("1a2b3c4d-0000-4000-8000-000000000002")
    order = uuid.UUID("9f8e7d6c-5b4a-4000-8000-00000000abcd")
    add_saga(conn, one, order)
    add_saga(conn, two, uuid.uuid4())

    def found(text: str) -> Any:
        return console.get("/console/saga", params={"saga_id": text}, follow_redirects=False)

    for text in (str(one), str(order), "9f8e7d6c", "9F8E-7D6C-5B", f"  {order}  "):
        answer = found(text)
        assert (answer.status_code, answer.headers.get("location")) == (303, f"/console/sagas/{one}"), text
    ambiguous = found("1a2b3c4d")
    assert ambiguous.status_code == 200
    assert sorted(saga_ids(ambiguous.text, "found")) == sorted([str(one), str(two)])
    assert "2 sagas match" in ambiguous.text and ambiguous.text.count("<td>saga id</td>") == 2
    missing = found("abcdef12")
    assert missing.status_code == 404
    assert "no saga has 'abcdef12' as its id, its order_id, or their start" in html.unescape(missing.text)
    short = found("1a2")
    assert short.status_code == 400 and "at least 4 characters" in short.text
    assert found("").status_code == 400 and found("x" * 300).status_code == 400


def test_the_stuck_filter_lists_every_stuck_saga_and_the_front_page_links_to_it(console: TestClient, conn) -> None:
    stuck = [uuid.uuid4() for _ in range(3)]
    for saga_id in stuck:
        add_saga(conn, saga_id, uuid.uuid4(), stuck=True)
    waiting = uuid.uuid4()
    add_saga(conn, waiting, uuid.uuid4())
    front = console.get("/console").text
    assert 'id="all-stuck" href="/console/sagas?stuck=yes"' in front
    listed = console.get("/console/sagas?stuck=yes").text
    assert sorted(saga_ids(listed, "saga-list")) == sorted(str(s) for s in stuck)
    assert 'name="stuck" value="yes" checked' in listed
    assert listed.count('<span class="badge bad">past deadline</span>') == 3
    # Combined with another filter, and kept by the next page's link.
    assert saga_ids(console.get("/console/sagas?stuck=yes&step=reserve_inventory").text, "saga-list") == []
    assert console.get("/console/sagas?stuck=maybe").status_code == 400
    page = console.get(f"/console/sagas/{stuck[0]}").text
    assert '<span id="overdue"><span class="badge bad">past deadline</span></span>' in page
    assert 'id="overdue"' not in console.get(f"/console/sagas/{waiting}").text


def park(conn: psycopg.Connection[Any], count: int, reason: str = "failed 4 times, last: OSError: disk full") -> None:
    with conn.cursor() as cur:
        for _ in range(count):
            cur.execute(
                "INSERT INTO payments.dead_letters (consumer, message_id, message, reason)"
                " VALUES ('payments.charge_payment', %s, %s, %s)",
                (str(uuid.uuid4()), Jsonb({"args": [{"customer_id": "nobody", "amount_cents": 1}]}), reason),
            )


def test_the_dead_letter_groups_are_listed_and_a_group_is_shown_a_page_at_a_time(console: TestClient, conn) -> None:
    park(conn, 120)
    park(conn, 2, "not a valid ChargePayment: amount")
    groups = console.get("/console/dead-letters")
    assert groups.status_code == 200
    counts = re.findall(r'<a href="(/console/dead-letters/payments/[^"]+)">(\d+)</a>', groups.text)
    assert [n for _, n in counts] == ["120", "2"]
    seen: list[str] = []
    url: str | None = counts[0][0]
    while url:
        page = console.get(url)
        assert page.status_code == 200
        parked = page.text.split('id="parked"', 1)[1].split("</section>", 1)[0]
        ids = re.findall(r'<tr id="letter-(\d+)">', parked)
        assert 0 < len(ids) <= 50 and ids == sorted(ids, key=int, reverse=True)
        seen += ids
        found = re.search(r'id="next-page" href="([^"]+)"', page.text)
        url = found.group(1) if found else None
    assert len(seen) == len(set(seen)) == 120
    assert console.get(counts[0][0] + "?before=x").status_code == 400


def test_a_replay_shows_its_dry_run_and_replays_only_the_count_confirmed(acting: TestClient, conn) -> None:
    park(conn, 3)
    front = acting.get("/console").text
    (preview_url,) = re.findall(r'<a class="replay" href="([^"]+)">', front)
    preview = acting.get(preview_url)
    assert preview.status_code == 200 and "a dry run: nothing was sent yet" in preview.text
    assert '<tr><td>would replay</td><td class="n">3</td></tr>' in preview.text
    assert "Replay these 3 letters" in preview.text
    assert conn.execute("SELECT count(*) FROM payments.outbox").fetchone() == (0,)  # the dry run sent nothing
    token = re.search(r'name="token" value="([^"]+)"', preview.text).group(1)  # type: ignore[union-attr]
    group = re.search(r'name="group" value="([^"]+)"', preview.text).group(1)  # type: ignore[union-attr]
    form = {"token": token, "service": "payments", "group": group}
    park(conn, 1)  # one more came in after the dry run: the confirmation no longer holds
    stale = acting.post("/console/dead-letters/replay", data={**form, "count": "3"})
    assert "holds 4 parked letters now, not the 3 confirmed: nothing was replayed" in stale.text
    assert conn.execute("SELECT count(*) FROM payments.outbox").fetchone() == (0,)
    done = acting.post("/console/dead-letters/replay", data={**form, "count": "4"})
    assert "dead letters: 4 replayed" in done.text
    assert conn.execute("SELECT count(*) FROM payments.outbox").fetchone() == (4,)


def test_the_timeline_says_which_step_each_transition_concerns_and_the_diagram_marks_the_failed_one(
    console: TestClient, runtime: Runtime, conn, database_url: str
) -> None:
    seed(runtime, {"c1": 100}, {"s1": 5})
    refused = place(runtime, "c1", "s1", 1, 3_000)  # not enough money: charge_payment fails
    Courier(runtime, conn).run()
    page = console.get(f"/console/sagas/{refused.saga_id}").text
    steps = re.findall(r'<td class="step">([^<]*)</td>', page)
    assert steps == [
        "charge_payment",  # its starter did place_order
        "charge_payment → undo place_order",
        "undo place_order → notify_cancellation",
        "notify_cancellation",
    ]
    assert re.search(r'<g class="node step taken failing" data-node="do:charge_payment">', page)
    assert 'id="legend"' in page and "the step that failed" in page
    shown = run(service_env(database_url, "stub://"), "sagas", "show", str(refused.saga_id))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"compensating\s+charge_payment → undo place_order\s", shown.stdout), shown.stdout


def test_the_kind_diagram_counts_the_sagas_standing_on_each_step(console: TestClient, conn) -> None:
    for n in range(3):
        add_saga(conn, uuid.uuid4(), uuid.uuid4(), stuck=n == 0)
    conn.execute(
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout, compensations)"
        " VALUES (%s, %s, 'compensating', 'place_order', '{}', '30 s', '{place_order,notify_cancellation}')",
        (uuid.uuid4(), uuid.uuid4()),
    )
    page = console.get("/console/kinds/order").text
    counts = dict(re.findall(r'<g class="count" data-node="([^"]+)" data-count="(\d+)">', page))
    assert counts == {"do:charge_payment": "3", "undo:place_order": "1"}
    assert 'id="legend"' in page
