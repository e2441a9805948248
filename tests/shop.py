"""Helpers for the order-system tests: seeding, placing orders, and a hand-driven courier."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from estafeta import Runtime, deliver
from estafeta_actors import inventory, payments
from estafeta_actors.order_saga import ORDER_SAGA, PlacedOrder, place_order
from estafeta_brokers.publish import to_message
from estafeta_sql import sagas
from estafeta_sql.outbox import OutboxRow
from estafeta_sql.sagas import SagaRow
from tests.app import STEPS
from tests.app import app as tests_app


def seed(runtime: Runtime, balances: Mapping[str, int], stock: Mapping[str, int]) -> None:
    """Open the accounts and stock the SKUs."""
    with runtime.database("payments").transaction() as conn:
        payments.open_accounts(conn, dict(balances))
    with runtime.database("inventory").transaction() as conn:
        inventory.add_stock(conn, dict(stock))


def place(
    runtime: Runtime,
    customer: str,
    sku: str,
    quantity: int,
    amount: int,
    *,
    step_timeout: float = 30.0,
    key: str | None = None,
) -> PlacedOrder:
    """Place one order in its own transaction."""
    with runtime.database("orders").transaction() as conn:
        return place_order(
            conn,
            customer_id=customer,
            sku=sku,
            quantity=quantity,
            amount_cents=amount,
            step_timeout=step_timeout,
            idempotency_key=key,
        )


def saga(conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> SagaRow:
    """The order saga's row."""
    row = sagas.get(conn, ORDER_SAGA.table, saga_id)
    assert row is not None
    return row


def events(conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> list[tuple[str, str, str]]:
    """The saga's timeline as (event, status, step)."""
    return [(e.event, e.status, e.step) for e in sagas.timeline(conn, ORDER_SAGA.table, saga_id)]


class Courier:
    """A relay and a worker the test drives by hand: outbox rows reach their steps one at a time.

    It lets a test hold a message back, drop it, or deliver it twice, deterministically.
    """

    def __init__(self, runtime: Runtime, conn: psycopg.Connection[Any]) -> None:
        self.runtime = runtime
        self.conn = conn

    def _waiting(self) -> list[tuple[str, OutboxRow]]:
        rows = []
        for service in tests_app.services:
            with self.conn.cursor(row_factory=dict_row) as cur:
                cur.execute(
                    pgsql.SQL(
                        "SELECT id, message_id, queue_name, actor_name, message, ordering_key, saga_id, created_at,"
                        " attempts FROM {}.outbox WHERE status = 'pending' ORDER BY id"
                    ).format(pgsql.Identifier(service.name))
                )
                rows += [(service.name, OutboxRow.from_row(r)) for r in cur.fetchall()]
        return rows

    def pending(self, actor: str | None = None) -> list[OutboxRow]:
        """Rows waiting in every outbox (or only those for ``actor``), oldest first per outbox."""
        return [row for _, row in self._waiting() if actor is None or row.actor_name == actor]

    def take(self, actor: str | None = None) -> OutboxRow:
        """Remove the oldest row (for ``actor``) from its outbox, as a relay that published it."""
        schema, row = next((s, r) for s, r in self._waiting() if actor is None or r.actor_name == actor)
        query = pgsql.SQL("DELETE FROM {}.outbox WHERE id = %s").format(pgsql.Identifier(schema))
        self.conn.execute(query, (row.id,))
        return row

    def deliver(self, row: OutboxRow) -> str:
        """Run the row's message through its step, as a worker would; return the outcome."""
        return deliver(STEPS[row.actor_name], self.runtime, to_message(row))

    def run(self, *, hold: frozenset[str] = frozenset(), limit: int = 500) -> list[tuple[str, str]]:
        """Deliver everything (but messages for ``hold`` actors) until nothing is left; return (actor, outcome)."""
        done = []
        while True:
            waiting = [r for r in self.pending() if r.actor_name not in hold]
            if not waiting:
                return done
            row = self.take(waiting[0].actor_name)
            done.append((row.actor_name, self.deliver(row)))
            if len(done) > limit:
                raise AssertionError(f"still delivering after {limit} messages: {done[-10:]}")
