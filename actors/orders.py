"""The Orders service: customers' orders, confirmed or cancelled by the order saga.

The saga itself (its orchestrator step and its state table) also lives here: see
:mod:`estafeta_actors.order_saga`.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from estafeta import BusinessFailure, Idempotency, Service, StepContext

from .migrations import MIGRATIONS

SERVICE = Service("orders", migrations=MIGRATIONS / "orders")
#: ``POST /orders`` (:mod:`estafeta_actors.http`) keeps its Idempotency-Key records in
#: ``orders.idempotency_keys``, in the transaction that places the order and starts its saga.
#: Declared here, where ``estafeta migrate`` sees it without the http extra; the server
#: declares its own with the TTL it was given (the same table).
IDEMPOTENCY = Idempotency(SERVICE)

#: Statuses of an order.
STATUSES = ("pending", "confirmed", "cancelled")


@attrs.frozen
class ConfirmOrder:
    """Confirm a pending order (its payment and stock are secured)."""

    order_id: uuid.UUID


@attrs.frozen
class CancelOrder:
    """Cancel a pending order (compensation of placing it)."""

    order_id: uuid.UUID


@attrs.frozen
class Order:
    """An order as stored."""

    order_id: uuid.UUID
    customer_id: str
    sku: str
    quantity: int
    amount_cents: int
    status: str
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime


def _set_status(conn: psycopg.Connection[Any], order_id: uuid.UUID, wanted: str, forbidden: str) -> None:
    changed = conn.execute(
        "UPDATE orders.orders SET status = %s, updated_at = now() WHERE order_id = %s AND status = 'pending'",
        (wanted, order_id),
    ).rowcount
    if changed:
        return
    found = conn.execute("SELECT status FROM orders.orders WHERE order_id = %s", (order_id,)).fetchone()
    if found is None:
        raise BusinessFailure(f"no order {order_id}")
    if found[0] == forbidden:
        raise BusinessFailure(f"order {order_id} is already {forbidden}")
    # Already `wanted`: a repeated command changes nothing.


@SERVICE.step(ConfirmOrder, lock=lambda command: str(command.order_id))
def confirm_order(ctx: StepContext, command: ConfirmOrder) -> None:
    """pending -> confirmed; a cancelled order is refused."""
    _set_status(ctx.conn, command.order_id, "confirmed", forbidden="cancelled")


@SERVICE.step(CancelOrder, lock=lambda command: str(command.order_id))
def cancel_order(ctx: StepContext, command: CancelOrder) -> None:
    """pending -> cancelled; a confirmed order is refused."""
    _set_status(ctx.conn, command.order_id, "cancelled", forbidden="confirmed")


def insert_order(
    conn: psycopg.Connection[Any],
    order_id: uuid.UUID,
    *,
    customer_id: str,
    sku: str,
    quantity: int,
    amount_cents: int,
    idempotency_key: str | None,
) -> bool:
    """Insert a pending order; ``False`` if that id or idempotency key is already taken."""
    return (
        conn.execute(
            """INSERT INTO orders.orders (order_id, customer_id, sku, quantity, amount_cents, idempotency_key)
               VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            (order_id, customer_id, sku, quantity, amount_cents, idempotency_key),
        ).rowcount
        == 1
    )


def _fetch(conn: psycopg.Connection[Any], query: str, params: Any) -> list[Order]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return [Order(**row) for row in cur.fetchall()]


def get_order(conn: psycopg.Connection[Any], order_id: uuid.UUID) -> Order | None:
    """The order ``order_id``, if it exists."""
    found = _fetch(
        conn,
        """SELECT order_id, customer_id, sku, quantity, amount_cents, status, idempotency_key, created_at, updated_at
           FROM orders.orders WHERE order_id = %s""",
        (order_id,),
    )
    return found[0] if found else None


def order_by_key(conn: psycopg.Connection[Any], idempotency_key: str) -> Order | None:
    """The order placed with ``idempotency_key``, if any."""
    found = _fetch(
        conn,
        """SELECT order_id, customer_id, sku, quantity, amount_cents, status, idempotency_key, created_at, updated_at
           FROM orders.orders WHERE idempotency_key = %s""",
        (idempotency_key,),
    )
    return found[0] if found else None


def list_orders(conn: psycopg.Connection[Any], *, status: str | None, limit: int) -> list[Order]:
    """Orders, newest first, optionally only those in ``status``."""
    return _fetch(
        conn,
        """SELECT order_id, customer_id, sku, quantity, amount_cents, status, idempotency_key, created_at, updated_at
           FROM orders.orders
           WHERE %(status)s::text IS NULL OR status = %(status)s::text
           ORDER BY created_at DESC LIMIT %(limit)s""",
        {"status": status, "limit": limit},
    )


def count_by_status(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How many orders are in each status (every status listed, zeros included)."""
    counts = dict.fromkeys(STATUSES, 0)
    for status, count in conn.execute("SELECT status, count(*) FROM orders.orders GROUP BY status").fetchall():
        counts[str(status)] = int(count)
    return counts
