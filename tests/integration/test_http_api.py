"""The order API on a real ``estafeta serve`` (uvicorn) process, through httpx: the Idempotency-Key rules
end to end, a SIGKILLed server in the middle of a request's transaction, the saga's id and trace."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql as pgsql

from estafeta import Runtime, Settings
from estafeta_actors.app import app as order_system

from ..helpers import scalar, wait_until
from ..http_server import Server, backend_gone, blocked_insert, orders_table_locked, serving
from ..services import admin_dsn, scratch_database

pytestmark = pytest.mark.integration

ORDER = {"customer_id": "c1", "sku": "s1", "quantity": 2, "amount_cents": 1500}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(database_url, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture
def client(server: Server, runtime: Any) -> Iterator[httpx.Client]:
    """A client of the module's server, on a database emptied for the test (``runtime`` wipes it)."""
    with server.client() as http:
        yield http


def post(http: httpx.Client, body: dict[str, Any], key: str | None, **headers: str) -> httpx.Response:
    sent = {"Idempotency-Key": key, **headers} if key is not None else headers
    return http.post("/orders", json=body, headers=sent)


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int]:
    """Orders, sagas, outbox rows and idempotency records in the orders database."""
    tables = ("orders.orders", "orders.saga_order", "orders.outbox", "orders.idempotency_keys")
    return tuple(int(scalar(conn, f"SELECT count(*) FROM {table}")) for table in tables)  # type: ignore[return-value]


def test_the_same_post_twice_places_one_order_and_answers_the_same_body(client: httpx.Client, conn) -> None:
    key = str(uuid.uuid4())
    first = post(client, ORDER, key)
    again = post(client, ORDER, key)
    assert first.status_code == again.status_code == 201, first.text
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    placed = first.json()
    assert first.headers["Saga-Id"] == again.headers["Saga-Id"] == placed["saga_id"]
    assert first.headers["Location"] == f"/orders/{placed['order_id']}"
    assert counts(conn) == (1, 1, 1, 1)  # one order, its saga, its first command, the key's record


def test_the_quoted_and_the_bare_form_are_one_key(client: httpx.Client, conn) -> None:
    key = str(uuid.uuid4())
    assert post(client, ORDER, f'"{key}"').status_code == 201
    assert post(client, ORDER, key).headers["Idempotent-Replayed"] == "true"
    assert counts(conn)[0] == 1


def test_the_same_key_with_another_body_is_a_422_problem(client: httpx.Client, conn) -> None:
    key = str(uuid.uuid4())
    assert post(client, ORDER, key).status_code == 201
    refused = post(client, {**ORDER, "amount_cents": 1600}, key)
    assert refused.status_code == 422
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["type"] == "urn:estafeta:problem:idempotency-key-reused"
    assert counts(conn)[0] == 1


def test_a_missing_or_malformed_key_is_a_400_problem_and_places_nothing(client: httpx.Client, conn) -> None:
    missing = post(client, ORDER, None)
    malformed = post(client, ORDER, "two words")
    assert (missing.status_code, malformed.status_code) == (400, 400)
    assert missing.json()["title"] == "Idempotency-Key is missing"
    assert malformed.json()["type"] == "urn:estafeta:problem:idempotency-key-invalid"
    assert counts(conn) == (0, 0, 0, 0)


def test_keys_are_scoped_per_client(client: httpx.Client, conn) -> None:
    key = str(uuid.uuid4())
    shop = post(client, ORDER, key, **{"X-Client-Id": "shop-1"})
    other = post(client, ORDER, key, **{"X-Client-Id": "shop-2"})
    anonymous = post(client, ORDER, key)
    assert [r.status_code for r in (shop, other, anonymous)] == [201, 201, 201]
    assert len({r.json()["order_id"] for r in (shop, other, anonymous)}) == 3
    assert post(client, ORDER, key, **{"X-Client-Id": "shop-2"}).json() == other.json()


def test_a_key_in_flight_is_a_409_with_retry_after_and_the_first_request_still_succeeds(
    client: httpx.Client, conn, database_url: str
) -> None:
    key = str(uuid.uuid4())
    answers: list[httpx.Response] = []
    with orders_table_locked(database_url):
        first = threading.Thread(target=lambda: answers.append(post(client, ORDER, key)))
        first.start()
        blocked_insert(conn)  # the first request holds its key, its transaction open
        second = post(client, ORDER, key)
        assert second.status_code == 409
        assert second.headers["Retry-After"] == "1"
        assert second.json()["type"] == "urn:estafeta:problem:idempotency-key-in-flight"
    first.join(30)
    assert answers[0].status_code == 201
    assert post(client, ORDER, key).headers["Idempotent-Replayed"] == "true"
    assert counts(conn)[0] == 1


def test_an_expired_key_places_a_new_order(client: httpx.Client, conn) -> None:
    key = str(uuid.uuid4())
    first = post(client, ORDER, key)
    kept = scalar(conn, "SELECT expires_at - created_at FROM orders.idempotency_keys")
    assert kept.total_seconds() == 24 * 3600  # estafeta serve's default --idempotency-ttl
    conn.execute("UPDATE orders.idempotency_keys SET expires_at = now() - interval '1 second'")
    second = post(client, ORDER, key)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second.headers
    assert second.json()["order_id"] != first.json()["order_id"]
    assert counts(conn)[0] == 2


def test_the_request_traceparent_continues_into_the_saga_trace(client: httpx.Client, conn) -> None:
    placed = post(client, ORDER, str(uuid.uuid4()), traceparent=TRACEPARENT)
    options = scalar(conn, "SELECT message->'options' FROM orders.outbox")
    assert options["saga_id"] == placed.headers["Saga-Id"]
    trace_id = TRACEPARENT.split("-")[1]
    assert options["traceparent"].split("-")[1] == trace_id
    assert options["traceparent"] != TRACEPARENT  # a span of its own in that trace


def test_an_order_and_its_saga_are_read_back_with_the_timeline(client: httpx.Client) -> None:
    placed = post(client, ORDER, str(uuid.uuid4())).json()
    order = client.get(f"/orders/{placed['order_id']}").json()
    assert {k: order[k] for k in ORDER} == ORDER
    assert order["status"] == "pending"
    assert order["saga"]["saga_id"] == placed["saga_id"]
    assert [e["event"] for e in order["saga"]["timeline"]] == ["started"]
    saga = client.get(f"/sagas/{placed['saga_id']}").json()
    assert (saga["kind"], saga["status"], saga["current_step"]) == ("order", "running", "charge_payment")


def test_errors_are_problem_documents(client: httpx.Client) -> None:
    for path, status in [(f"/orders/{uuid.uuid4()}", 404), (f"/sagas/{uuid.uuid4()}", 404), ("/orders/x", 422)]:
        answer = client.get(path)
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.json()["status"] == status
    invalid = post(client, {**ORDER, "quantity": 0, "extra": 1}, str(uuid.uuid4()))
    assert invalid.status_code == 422
    assert "body.quantity" in invalid.json()["detail"] and "body.extra" in invalid.json()["detail"]
    assert client.get("/health").json() == {"status": "ok"}


def test_a_server_killed_inside_the_transaction_stores_nothing_and_the_retry_places_the_order(
    database_url: str, conn, tmp_path: Path
) -> None:
    key = str(uuid.uuid4())
    failures: list[Exception] = []

    def send(server: Server) -> None:
        try:
            with server.client() as http:
                post(http, ORDER, key)
        except httpx.TransportError as exc:
            failures.append(exc)

    with serving(database_url, tmp_path) as doomed, orders_table_locked(database_url):
        request = threading.Thread(target=send, args=(doomed,))
        request.start()
        backend = blocked_insert(conn)  # the order's transaction is open: key taken, nothing committed
        doomed.process.kill(signal.SIGKILL)
        doomed.process.popen.wait(10)
        request.join(30)
    assert failures, "the client should have lost its connection"
    backend_gone(conn, backend)  # PostgreSQL ended the dead server's transaction, uncommitted
    assert counts(conn) == (0, 0, 0, 0)
    with serving(database_url, tmp_path) as restarted, restarted.client() as http:
        retry = post(http, ORDER, key)
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
        assert post(http, ORDER, key).headers["Idempotent-Replayed"] == "true"
    assert counts(conn) == (1, 1, 1, 1)


def test_the_server_prunes_expired_records_and_keeps_live_ones(database_url: str, conn, tmp_path: Path) -> None:
    with (
        serving(database_url, tmp_path, "--prune-interval", "0.2", "--no-access-log") as server,
        server.client() as http,
    ):
        for _ in range(3):
            assert post(http, ORDER, str(uuid.uuid4())).status_code == 201
        conn.execute(
            "UPDATE orders.idempotency_keys SET expires_at = now() - interval '1 minute'"
            " WHERE key <> (SELECT min(key) FROM orders.idempotency_keys)"
        )
        wait_until(lambda: counts(conn)[3] == 1, timeout=20, what="the expired records pruned")
    assert counts(conn)[0] == 3  # the orders stay: only their keys' records went


def test_a_database_that_goes_away_is_a_503_problem_with_retry_after(tmp_path: Path) -> None:
    with scratch_database() as dsn:
        runtime = Runtime(Settings(database_url=dsn))
        order_system.migrate(runtime)
        runtime.close()
        with serving(dsn, tmp_path, "--no-access-log") as server, server.client() as http:
            with psycopg.connect(admin_dsn(), autocommit=True) as admin:
                name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
                admin.execute(pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(str(name))))
            answer = post(http, ORDER, str(uuid.uuid4()))
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "5"
            assert answer.json()["title"] == "Service Unavailable"
            assert str(name) not in answer.text  # no DSN, host or password in the answer


def test_a_body_over_64_kib_is_a_413_problem_whether_its_length_is_declared_or_not(client: httpx.Client) -> None:
    big = b'{"customer_id": "' + b"x" * 70_000 + b'"}'
    declared = client.post("/orders", content=big, headers={"Idempotency-Key": "k", "Content-Type": "application/json"})
    streamed = client.post(
        "/orders",
        content=iter([big[:40_000], big[40_000:]]),
        headers={"Idempotency-Key": "k2", "Content-Type": "application/json"},
    )
    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text
        assert answer.headers["Content-Type"] == "application/problem+json"
