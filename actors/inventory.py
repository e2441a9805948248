"""The Inventory service: stock per SKU, reserved and released once per order.

Like payments: serialised on the order id, idempotent by the reservation row's status
(one row per order, ever), a refused reservation leaves a ``refused`` row (the order's
one decision), and a release that finds no reservation leaves a ``released`` row of
quantity 0 so that a reservation arriving late is refused.
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

import attrs
import psycopg

from estafeta import BusinessFailure, EstafetaError, Service, StepContext

from .migrations import MIGRATIONS

SERVICE = Service("inventory", migrations=MIGRATIONS / "inventory")


@attrs.frozen
class ReserveStock:
    """Set ``quantity`` of ``sku`` aside for an order."""

    order_id: uuid.UUID
    sku: str
    quantity: int


@attrs.frozen
class ReleaseStock:
    """Put back whatever the order reserved (compensation of :class:`ReserveStock`)."""

    order_id: uuid.UUID
    sku: str


class SkuGone(EstafetaError):
    """Released stock has no SKU row to go back to (retried, then the saga fails for an operator)."""


def _order_lock(command: ReserveStock | ReleaseStock) -> str:
    return str(command.order_id)


@SERVICE.step(ReserveStock, lock=_order_lock)
def reserve_stock(ctx: StepContext, command: ReserveStock) -> dict[str, Any]:
    """Reserve the stock once; refuse (business failure) an unknown SKU or too little stock.

    A refusal is the order's one decision: recorded, so a reservation of the order retried
    later is refused too.
    """
    conn = ctx.conn
    found = conn.execute(
        "SELECT status, quantity, reason FROM inventory.reservations WHERE order_id = %s", (command.order_id,)
    ).fetchone()
    if found is not None:
        status, quantity, reason = found
        if status == "reserved":
            return {"reserved": int(quantity)}
        if status == "refused":
            raise BusinessFailure(f"order {command.order_id} was refused before: {reason}")
        raise BusinessFailure(f"order {command.order_id} was cancelled before its stock could be reserved")
    taken = conn.execute(
        """UPDATE inventory.stock SET available = available - %(quantity)s, updated_at = now()
           WHERE sku = %(sku)s AND available >= %(quantity)s""",
        {"quantity": command.quantity, "sku": command.sku},
    ).rowcount
    if not taken:
        _refuse(ctx, command, _why_not(conn, command))
    conn.execute(
        """INSERT INTO inventory.reservations (order_id, sku, quantity, status, saga_id)
           VALUES (%s, %s, %s, 'reserved', %s)""",
        (command.order_id, command.sku, command.quantity, ctx.saga_id),
    )
    return {"reserved": command.quantity}


def _why_not(conn: psycopg.Connection[Any], command: ReserveStock) -> str:
    available = conn.execute("SELECT available FROM inventory.stock WHERE sku = %s", (command.sku,)).fetchone()
    if available is None:
        return f"unknown SKU {command.sku}"
    return f"out of stock: {available[0]} of {command.sku} left, order {command.order_id} needs {command.quantity}"


def _refuse(ctx: StepContext, command: ReserveStock, reason: str) -> NoReturn:
    def record(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            """INSERT INTO inventory.reservations (order_id, sku, quantity, status, saga_id, reason)
               VALUES (%s, %s, 0, 'refused', %s, %s)""",
            (command.order_id, command.sku, ctx.saga_id, reason),
        )

    ctx.on_refusal(record)
    raise BusinessFailure(reason)


@SERVICE.step(ReleaseStock, lock=_order_lock)
def release_stock(ctx: StepContext, command: ReleaseStock) -> dict[str, Any]:
    """Put the order's reservation back into stock, once."""
    conn = ctx.conn
    found = conn.execute(
        "SELECT status, quantity, sku FROM inventory.reservations WHERE order_id = %s FOR UPDATE",
        (command.order_id,),
    ).fetchone()
    if found is None:
        conn.execute(
            """INSERT INTO inventory.reservations (order_id, sku, quantity, status, saga_id)
               VALUES (%s, %s, 0, 'released', %s)""",
            (command.order_id, command.sku, ctx.saga_id),
        )
        return {"released": 0}
    status, quantity, sku = found
    if status in ("released", "refused"):
        return {"released": 0}
    returned = conn.execute(
        "UPDATE inventory.stock SET available = available + %s, updated_at = now() WHERE sku = %s", (quantity, sku)
    ).rowcount
    if not returned:
        raise SkuGone(f"cannot release {quantity} of {sku} for order {command.order_id}: the SKU is gone")
    conn.execute(
        "UPDATE inventory.reservations SET status = 'released', updated_at = now() WHERE order_id = %s",
        (command.order_id,),
    )
    return {"released": int(quantity)}


def add_stock(conn: psycopg.Connection[Any], levels: dict[str, int]) -> int:
    """Create the SKUs that do not exist yet with the given stock; return how many were created."""
    created = 0
    for sku, available in levels.items():
        created += conn.execute(
            "INSERT INTO inventory.stock (sku, available) VALUES (%s, %s) ON CONFLICT DO NOTHING", (sku, available)
        ).rowcount
    return created
