"""The HTTP server: one request whose handler fails inside its transaction answers 500 alone.

A live ``estafeta serve`` (uvicorn) takes a burst of concurrent orders, one of them
poisoned: a trigger of the test's database fails its insert after holding its
transaction open a while. Every other order is placed, the poisoned one is a problem
document and a log line, its key is not left held, and the server keeps serving.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ..helpers import scalar, wait_until
from ..http_server import Server, serving

pytestmark = pytest.mark.integration

ORDERS = 24
POISON = "poison"


@pytest.fixture
def poisoned_orders(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Orders of customer ``poison`` fail at their INSERT, half a second into their transaction."""
    conn.execute(
        """CREATE FUNCTION orders.poisoned() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.customer_id = 'poison' THEN
               PERFORM pg_sleep(0.5);
               RAISE EXCEPTION 'poisoned order of customer %', NEW.customer_id;
             END IF;
             RETURN NEW;
           END $$"""
    )
    conn.execute(
        "CREATE TRIGGER poisoned BEFORE INSERT ON orders.orders FOR EACH ROW EXECUTE FUNCTION orders.poisoned()"
    )
    try:
        yield
    finally:
        conn.execute("DROP FUNCTION IF EXISTS orders.poisoned() CASCADE")


def place(server: Server, customer: str, key: str) -> httpx.Response:
    body = {"customer_id": customer, "sku": "s1", "quantity": 1, "amount_cents": 700}
    with server.client() as http:
        return http.post("/orders", json=body, headers={"Idempotency-Key": key})


def test_a_request_whose_handler_fails_answers_500_alone_and_the_server_keeps_serving(
    database_url: str, runtime: Any, conn: psycopg.Connection[Any], poisoned_orders: None, tmp_path: Path
) -> None:
    customers = [f"c{n}" for n in range(ORDERS)]
    customers[ORDERS // 2] = POISON
    keys = [str(uuid.uuid4()) for _ in customers]
    with serving(database_url, tmp_path, "--no-access-log") as server:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda pair: place(server, *pair), zip(customers, keys, strict=True)))
        poisoned = answers.pop(ORDERS // 2)
        assert [a.status_code for a in answers] == [201] * (ORDERS - 1)
        assert poisoned.status_code == 500 and poisoned.headers["Content-Type"] == "application/problem+json"
        assert poisoned.json()["detail"] == "the server failed; nothing was stored"
        assert "poisoned order" not in poisoned.text  # the cause is logged, never sent
        wait_until(lambda: "POST /orders failed" in server.process.output(), what="the failure's log line")
        assert "poisoned order of customer poison" in server.process.output()
        # Its key was not left held (a 409 "in flight" forever): a retry is tried again.
        assert place(server, POISON, keys[ORDERS // 2]).status_code == 500
        # The server keeps serving, and the same key succeeds once the cause is gone.
        assert place(server, "c-after", str(uuid.uuid4())).status_code == 201
        conn.execute("DROP TRIGGER poisoned ON orders.orders")
        assert place(server, POISON, keys[ORDERS // 2]).status_code == 201
        assert httpx.get(f"{server.url}/health").status_code == 200
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == ORDERS + 1
    assert scalar(conn, "SELECT count(*) FROM orders.orders WHERE customer_id = %s", POISON) == 1


def test_a_conflict_or_timeout_in_a_request_answers_503_with_retry_after(
    database_url: str, runtime: Any, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A serialization failure is worth a retry: 503 and Retry-After, not the 500 of a bug."""
    conn.execute(
        """CREATE FUNCTION orders.conflicted() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.customer_id = 'conflict' THEN
               RAISE EXCEPTION 'could not serialize' USING ERRCODE = 'serialization_failure';
             END IF;
             RETURN NEW;
           END $$"""
    )
    conn.execute(
        "CREATE TRIGGER conflicted BEFORE INSERT ON orders.orders FOR EACH ROW EXECUTE FUNCTION orders.conflicted()"
    )
    try:
        with serving(database_url, tmp_path, "--no-access-log") as server:
            answer = place(server, "conflict", str(uuid.uuid4()))
            assert answer.status_code == 503 and answer.headers["Retry-After"]
            assert answer.headers["Content-Type"] == "application/problem+json"
            assert place(server, "c1", str(uuid.uuid4())).status_code == 201
    finally:
        conn.execute("DROP FUNCTION IF EXISTS orders.conflicted() CASCADE")
