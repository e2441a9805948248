"""The console's own queries on PostgreSQL: dead letters grouped by consumer and cause."""

from __future__ import annotations

import uuid

import pytest

from sql import console

from .conftest import all_services
from .test_migrations import _assert_prepares


@pytest.mark.parametrize("service", [s.name for s in all_services()])
@pytest.mark.parametrize("name", console.names())
def test_every_console_query_compiles_against_every_service_schema(service: str, name: str, conn, runtime) -> None:
    _assert_prepares(conn, name, console.query(name, service))


def park(conn, consumer: str, reason: str) -> None:
    conn.execute(
        "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, '{}', %s)",
        (consumer, str(uuid.uuid4()), reason),
    )


def test_dead_letters_differing_only_in_ids_and_numbers_are_one_cause(conn, runtime) -> None:
    for n in range(3):
        park(conn, "payments.charge_payment", f"insufficient funds: order {uuid.uuid4()} needs {100 + n} cents")
    park(conn, "payments.charge_payment", "not a valid ChargePayment: missing field amount_cents")
    park(conn, "payments.refund_payment", f"insufficient funds: order {uuid.uuid4()} needs 7 cents")

    causes = console.dead_letters_by_cause(conn, "payments")
    found = [(c.consumer, c.cause, c.count) for c in causes]
    # The most frequent cause first, its newest reason kept as written; ties in no set order.
    assert found[0] == ("payments.charge_payment", "insufficient funds: order <id> needs <n> cents", 3)
    assert causes[0].latest_reason.endswith("needs 102 cents")
    assert sorted(found[1:]) == [
        ("payments.charge_payment", "not a valid ChargePayment: missing field amount_cents", 1),
        ("payments.refund_payment", "insufficient funds: order <id> needs <n> cents", 1),
    ]
