"""The outbox records what it holds: every row's command or event class, and a breakdown by type."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from estafeta import Reply, Runtime, deliver
from estafeta_actors.payments import ChargePayment
from estafeta_brokers.publish import to_message
from estafeta_sql import outbox as store
from examples.welcome.flow import BonusActivated, CustomerRegistered, activate_welcome_bonus, register_customer

from .integration.processes import service_env
from .shop import Courier, place, seed
from .test_cli import run


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    """The environment of a CLI run on this run's database."""
    return service_env(database_url, "stub://")


def _type_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _types(conn: psycopg.Connection[Any], schema: str) -> list[tuple[str, str | None]]:
    """(actor, message type) of every row in ``schema``'s outbox, in id order."""
    query = pgsql.SQL("SELECT actor_name, message_type FROM {}.outbox ORDER BY id").format(pgsql.Identifier(schema))
    return [(str(actor), kind) for actor, kind in conn.execute(query).fetchall()]


def test_a_saga_send_and_a_step_reply_record_their_class(runtime: Runtime, conn: psycopg.Connection[Any]) -> None:
    seed(runtime, {"alice": 1_000}, {"sku-1": 5})
    place(runtime, "alice", "sku-1", 1, 300)
    assert _types(conn, "orders") == [("payments.charge_payment", _type_name(ChargePayment))]

    courier = Courier(runtime, conn)
    assert courier.deliver(courier.take("payments.charge_payment")) == "ok"
    assert _types(conn, "payments") == [("orders.saga_order_reply", _type_name(Reply))]


def test_a_publish_records_the_event_class_for_every_subscriber(
    runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    with runtime.database("customers").transaction() as tx:
        register_customer(tx, "ada@example.com")
    assert _types(conn, "customers") == [("bonus.activate_welcome_bonus", _type_name(CustomerRegistered))]

    # The bonus step publishes BonusActivated to its two subscribers, in its transaction.
    with conn.transaction():
        row = store.claim_batch(conn, "customers", 10)[0]
    assert deliver(activate_welcome_bonus, runtime, to_message(row)) == "ok"
    assert sorted(_types(conn, "bonus")) == [
        ("customers.record_bonus", _type_name(BonusActivated)),
        ("mailer.send_welcome", _type_name(BonusActivated)),
    ]


def test_stats_by_type_counts_pending_and_failed_per_type_and_shows_untyped_rows(
    env: dict[str, str],
    runtime: Runtime,
    conn: psycopg.Connection[Any],
) -> None:
    seed(runtime, {"alice": 10_000}, {"sku-1": 50})
    for _ in range(3):
        place(runtime, "alice", "sku-1", 1, 300)
    conn.execute("UPDATE orders.outbox SET status = 'failed' WHERE id = (SELECT min(id) FROM orders.outbox)")
    # A row written before the outbox recorded types.
    with runtime.database("orders").transaction() as tx:
        store.insert(tx, "orders", store.OutgoingMessage(uuid.uuid4(), "payments", "payments.charge_payment"))

    result = run(env, "outbox", "stats", "--by-type", "--service", "orders")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SERVICE", "TYPE", "PENDING", "FAILED", "OLDEST"]
    charge = next(line.split() for line in lines if _type_name(ChargePayment) in line)
    assert charge[:4] == ["orders", _type_name(ChargePayment), "2", "1"]
    unknown = next(line.split() for line in lines if "(unknown)" in line)
    assert unknown[:4] == ["orders", "(unknown)", "1", "0"]

    result = run(env, "outbox", "stats", "--by-type", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["service"], r["message_type"]): r for r in json.loads(result.stdout)}
    assert (rows["orders", _type_name(ChargePayment)]["pending"], rows["orders", "(unknown)"]["pending"]) == (2, 1)
    assert not any(service == "payments" for service, _ in rows)
