"""The Idempotency-Key core on a real PostgreSQL: the draft's answers, and the record in the work's transaction."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from estafeta import (
    HttpResponse,
    Idempotency,
    IdempotencyKeyInFlight,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    IdempotentRequest,
    Problem,
    Runtime,
    StatementFailed,
    parse_idempotency_key,
)
from estafeta_actors import orders
from estafeta_sql import idempotency as store

from .helpers import scalar

KEYS = Idempotency(orders.SERVICE, ttl=60)


def request(body: dict[str, Any] | bytes, *, key: str | None = "k-1", client: str = "shop-1") -> IdempotentRequest:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return IdempotentRequest(client, key, "POST", "/orders", data, "application/json")


class Placer:
    """A handler that inserts an order and answers with ``status``; counts its calls."""

    def __init__(self, status: int = 201) -> None:
        self.status = status
        self.calls = 0

    def __call__(self, conn: psycopg.Connection[Any]) -> HttpResponse:
        self.calls += 1
        order_id = uuid.uuid4()
        orders.insert_order(
            conn, order_id, customer_id="c1", sku="s1", quantity=1, amount_cents=100, idempotency_key=None
        )
        return HttpResponse.json(self.status, {"order_id": str(order_id)}, {"Location": f"/orders/{order_id}"})


def order_count(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM orders.orders"))


def record_count(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM orders.idempotency_keys"))


# -- the header ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('  "abc"  ', "abc"),
        ('"a b"', "a b"),
        (r'"say \"hi\" \\ bye"', 'say "hi" \\ bye'),
        ('"abc";version=1', "abc"),
    ],
)
def test_the_quoted_and_the_bare_form_name_a_key(header: str, key: str) -> None:
    assert parse_idempotency_key(header) == key


@pytest.mark.parametrize("header", ['"abc', "a b", "a, b", '"a\\x"', "é", '""', "x" * 256, '"abc" x'])
def test_a_malformed_key_is_a_400(header: str) -> None:
    with pytest.raises(IdempotencyKeyInvalid) as raised:
        parse_idempotency_key(header)
    assert raised.value.status == 400


def test_a_missing_key_is_a_400_where_one_is_required() -> None:
    for header in (None, "", "   "):
        with pytest.raises(IdempotencyKeyMissing) as raised:
            parse_idempotency_key(header)
        assert raised.value.status == 400
        assert parse_idempotency_key(header, required=False) is None


def test_the_fingerprint_ignores_json_key_order_and_spacing_but_nothing_else() -> None:
    base = request(b'{"sku": "s1", "quantity": 2}')
    assert base.fingerprint == request(b'{ "quantity":2,\n "sku":"s1" }').fingerprint
    assert base.fingerprint != request(b'{"sku": "s1", "quantity": 3}').fingerprint
    other_path = IdempotentRequest("shop-1", "k-1", "POST", "/orders?x=1", base.body, "application/json")
    assert base.fingerprint != other_path.fingerprint
    other_method = IdempotentRequest("shop-1", "k-1", "PUT", "/orders", base.body, "application/json")
    assert base.fingerprint != other_method.fingerprint


# -- running a request ----------------------------------------------------------------------


def test_a_repeat_replays_the_stored_answer_without_running_the_handler(runtime: Runtime, conn) -> None:
    handler = Placer()
    first = KEYS.run(runtime, request({"sku": "s1"}), handler)
    again = KEYS.run(runtime, request({"sku": "s1"}), handler)
    assert handler.calls == 1
    assert (first.status, first.body, first.replayed) == (201, first.body, False)
    assert (again.status, again.headers, again.body, again.replayed) == (201, first.headers, first.body, True)
    assert order_count(conn) == 1


def test_the_same_key_with_another_body_is_a_422_and_changes_nothing(runtime: Runtime, conn) -> None:
    handler = Placer()
    KEYS.run(runtime, request({"sku": "s1"}), handler)
    with pytest.raises(IdempotencyKeyReused) as raised:
        KEYS.run(runtime, request({"sku": "s2"}), handler)
    assert raised.value.status == 422
    assert handler.calls == 1
    assert order_count(conn) == 1


def test_keys_are_scoped_per_client(runtime: Runtime, conn) -> None:
    handler = Placer()
    KEYS.run(runtime, request({"sku": "s1"}, client="shop-1"), handler)
    answer = KEYS.run(runtime, request({"sku": "s1"}, client="shop-2"), handler)
    assert (handler.calls, answer.replayed, order_count(conn), record_count(conn)) == (2, False, 2, 2)


def test_a_refusal_is_stored_and_replayed_and_its_writes_are_rolled_back(runtime: Runtime, conn) -> None:
    handler = Placer(status=409)
    first = KEYS.run(runtime, request({"sku": "s1"}), handler)
    again = KEYS.run(runtime, request({"sku": "s1"}), handler)
    assert (first.status, again.status, again.replayed, handler.calls) == (409, 409, True, 1)
    assert order_count(conn) == 0
    assert record_count(conn) == 1


class OutOfStock(Problem):
    """No stock left."""

    status = 409
    title = "Out of stock"


def test_a_4xx_problem_raised_by_the_handler_is_the_stored_answer(runtime: Runtime, conn) -> None:
    def refuse(c: psycopg.Connection[Any]) -> HttpResponse:
        Placer()(c)  # a write the refusal must undo
        raise OutOfStock("sku s1 has 0 left")

    first = KEYS.run(runtime, request({"sku": "s1"}), refuse)
    assert first.status == 409
    document = {"type": "about:blank", "title": "Out of stock", "status": 409, "detail": "sku s1 has 0 left"}
    assert json.loads(first.body) == document
    assert dict(first.headers)["content-type"] == "application/problem+json"
    assert KEYS.run(runtime, request({"sku": "s1"}), Placer()).replayed
    assert order_count(conn) == 0


@pytest.mark.parametrize("failure", ["5xx answer", "5xx problem", "exception"])
def test_a_server_error_stores_nothing_and_the_retry_runs_again(runtime: Runtime, conn, failure: str) -> None:
    def fail(c: psycopg.Connection[Any]) -> HttpResponse:
        Placer()(c)
        if failure == "5xx answer":
            return HttpResponse.json(503, {"error": "try later"})
        if failure == "5xx problem":
            raise Problem("payment gateway down", status=502)
        raise RuntimeError("bug")

    if failure == "exception":
        with pytest.raises(RuntimeError):
            KEYS.run(runtime, request({"sku": "s1"}), fail)
    else:
        assert KEYS.run(runtime, request({"sku": "s1"}), fail).status in (502, 503)
    assert (order_count(conn), record_count(conn)) == (0, 0)
    retry = Placer()
    assert KEYS.run(runtime, request({"sku": "s1"}), retry).status == 201
    assert (retry.calls, order_count(conn), record_count(conn)) == (1, 1, 1)


def test_a_key_whose_first_request_is_running_is_a_409_with_retry_after_at_once(runtime: Runtime, conn) -> None:
    inside, release = threading.Event(), threading.Event()
    placer = Placer()

    def slow(c: psycopg.Connection[Any]) -> HttpResponse:
        inside.set()
        assert release.wait(10)
        return placer(c)

    answers: list[HttpResponse] = []
    first = threading.Thread(target=lambda: answers.append(KEYS.run(runtime, request({"sku": "s1"}), slow)))
    first.start()
    try:
        assert inside.wait(10)
        with pytest.raises(IdempotencyKeyInFlight) as raised:
            KEYS.run(runtime, request({"sku": "s1"}), Placer())
        assert (raised.value.status, raised.value.headers) == (409, {"Retry-After": "1"})
        # Another key of the same client is not held up.
        assert KEYS.run(runtime, request({"sku": "s1"}, key="k-2"), Placer()).status == 201
    finally:
        release.set()
        first.join(10)
    assert answers[0].status == 201
    assert KEYS.run(runtime, request({"sku": "s1"}), Placer()).replayed


def test_an_expired_key_runs_again_and_its_record_is_replaced(runtime: Runtime, conn) -> None:
    handler = Placer()
    KEYS.run(runtime, request({"sku": "s1"}), handler)
    ttl = scalar(conn, "SELECT expires_at - created_at FROM orders.idempotency_keys")
    assert ttl == timedelta(seconds=60)
    conn.execute("UPDATE orders.idempotency_keys SET expires_at = now() - interval '1 second'")
    # Expired, even a different body is a new request.
    answer = KEYS.run(runtime, request({"sku": "s2"}), handler)
    assert (answer.status, answer.replayed, handler.calls, order_count(conn), record_count(conn)) == (
        201,
        False,
        2,
        2,
        1,
    )


def test_without_a_key_the_handler_runs_with_no_record(runtime: Runtime, conn) -> None:
    handler = Placer()
    KEYS.run(runtime, request({"sku": "s1"}, key=None), handler)
    KEYS.run(runtime, request({"sku": "s1"}, key=None), handler)
    assert (handler.calls, order_count(conn), record_count(conn)) == (2, 2, 0)


def test_expired_records_are_pruned_in_batches_and_live_ones_kept(runtime: Runtime, conn) -> None:
    for i in range(28):
        KEYS.run(runtime, request({"sku": "s1"}, key=f"k-{i}"), lambda c: HttpResponse.json(200, {}))
    conn.execute(
        "UPDATE orders.idempotency_keys SET expires_at = now() - interval '1 minute' WHERE key <> ALL(%s)",
        (["k-0", "k-1", "k-2"],),
    )
    assert store.prune(conn, "orders", 10) == 10  # one batch is one bounded DELETE
    assert KEYS.prune(runtime, batch_size=10) == 15
    assert sorted(r[0] for r in conn.execute("SELECT key FROM orders.idempotency_keys")) == ["k-0", "k-1", "k-2"]


def test_a_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl"):
        Idempotency(orders.SERVICE, ttl=0)


@pytest.mark.parametrize("name", store.names())
def test_every_idempotency_query_compiles_against_the_migrated_schema(name: str, conn, runtime) -> None:
    from .test_migrations import _assert_prepares

    _assert_prepares(conn, name, store.query(name, "orders"))


def test_without_a_key_a_refusal_leaves_nothing_behind(runtime: Runtime, conn) -> None:
    def refuse(c: psycopg.Connection[Any]) -> HttpResponse:
        Placer()(c)
        raise OutOfStock()

    assert KEYS.run(runtime, request({"sku": "s1"}, key=None), Placer(status=422)).status == 422
    assert KEYS.run(runtime, request({"sku": "s1"}, key=None), refuse).status == 409
    assert (order_count(conn), record_count(conn)) == (0, 0)


def test_a_record_committed_between_the_claim_and_the_store_wins_and_is_replayed(runtime: Runtime, conn) -> None:
    asked = request({"sku": "s1"})
    winner = HttpResponse.json(201, {"order_id": "the winner's"})

    def lose_the_race(c: psycopg.Connection[Any]) -> HttpResponse:
        response = Placer()(c)
        # Another request with the key committed its record after this transaction's
        # claim looked (its snapshot), as a holder ending between the snapshot and the lock.
        store.store(
            conn, "orders", client=asked.client, key="k-1", fingerprint=asked.fingerprint, method="POST",
            target="/orders", status=winner.status, headers=winner.headers, body=winner.body, ttl=timedelta(minutes=1),
        )  # fmt: skip
        return response

    answer = KEYS.run(runtime, asked, lose_the_race)
    assert (answer.status, answer.body, answer.replayed) == (201, winner.body, True)
    assert (order_count(conn), record_count(conn)) == (0, 1)  # the loser's order rolled back


def insert_an_order_taken_meanwhile(other: psycopg.Connection[Any], c: psycopg.Connection[Any]) -> HttpResponse:
    """A handler's insert of an order ``other`` committed first, after the claim: it fails (the same id)."""
    order_id = uuid.uuid4()
    orders.insert_order(other, order_id, customer_id="c1", sku="s1", quantity=1, amount_cents=100, idempotency_key=None)
    c.execute(
        "INSERT INTO orders.orders (order_id, customer_id, sku, quantity, amount_cents)"
        " VALUES (%s, 'c1', 's1', 1, 100)",
        (order_id,),
    )
    return HttpResponse.json(201, {"order_id": str(order_id)})


def test_a_handler_failing_on_the_writes_of_a_record_committed_after_the_claim_answers_with_that_record(
    runtime: Runtime, conn
) -> None:
    # The race a Django test met under load (a 500 for a key answered 201): two requests with
    # one key, the second's claim reading before the first committed (its snapshot) and
    # locking after, its handler then failing on the first's row (the same unique name).
    asked = request({"sku": "s1"})
    winner = HttpResponse.json(201, {"order_id": "the winner's"})
    calls = 0

    def collide(c: psycopg.Connection[Any]) -> HttpResponse:
        nonlocal calls
        calls += 1
        # The winner commits its order and record after this transaction's claim looked.
        store.store(
            conn, "orders", client=asked.client, key="k-1", fingerprint=asked.fingerprint, method="POST",
            target="/orders", status=winner.status, headers=winner.headers, body=winner.body, ttl=timedelta(minutes=1),
        )  # fmt: skip
        return insert_an_order_taken_meanwhile(conn, c)

    answer = KEYS.run(runtime, asked, collide)
    assert (answer.status, answer.body, answer.replayed) == (201, winner.body, True)
    assert (calls, order_count(conn), record_count(conn)) == (1, 1, 1)


def test_a_handler_failure_with_no_record_meanwhile_is_raised_as_it_was(runtime: Runtime, conn) -> None:
    with pytest.raises(StatementFailed, match="orders_pkey"):  # as it was raised: the handler's own failure
        KEYS.run(runtime, request({"sku": "s1"}), lambda c: insert_an_order_taken_meanwhile(conn, c))
    assert record_count(conn) == 0


def test_a_finished_key_is_replayed_even_while_its_lock_is_held(runtime: Runtime, conn, database_url: str) -> None:
    first = KEYS.run(runtime, request({"sku": "s1"}), Placer())
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (KEYS._lock_name("shop-1", "k-1"),))
        again = KEYS.run(runtime, request({"sku": "s1"}), Placer())
    assert (again.replayed, again.body) == (True, first.body)
