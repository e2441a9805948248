"""The Payments service: customers' accounts, charged and refunded once per order.

Both steps serialise on the order id and are idempotent by the payment row's status
(one row per order, ever): a second charge returns the first payment, a second refund
changes nothing, and a refund that finds no charge leaves a ``refunded`` row of 0 cents
so that a charge arriving after its saga gave up on it is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import psycopg

from estafeta import BusinessFailure, EstafetaError, Service, StepContext

from .migrations import MIGRATIONS

SERVICE = Service("payments", migrations=MIGRATIONS / "payments")


@attrs.frozen
class ChargePayment:
    """Take ``amount_cents`` from the customer's account for an order."""

    order_id: uuid.UUID
    customer_id: str
    amount_cents: int


@attrs.frozen
class RefundPayment:
    """Give back whatever the order was charged (compensation of :class:`ChargePayment`)."""

    order_id: uuid.UUID
    customer_id: str


class AccountGone(EstafetaError):
    """The money of a refund has no account to go back to.

    Not a business failure: retrying cannot help until an operator restores the account,
    so the refund is retried, then parked, and its saga ends ``failed`` for the operator.
    """


def _order_lock(command: ChargePayment | RefundPayment) -> str:
    return str(command.order_id)


@SERVICE.step(ChargePayment, lock=_order_lock)
def charge_payment(ctx: StepContext, command: ChargePayment) -> dict[str, Any]:
    """Charge the order once; refuse (business failure) without an account or enough money."""
    conn = ctx.conn
    found = conn.execute(
        "SELECT payment_id, status FROM payments.payments WHERE order_id = %s", (command.order_id,)
    ).fetchone()
    if found is not None:
        if found[1] == "charged":
            return {"payment_id": str(found[0])}
        raise BusinessFailure(f"order {command.order_id} was cancelled before it could be charged")
    taken = conn.execute(
        """UPDATE payments.accounts SET balance_cents = balance_cents - %(amount)s, updated_at = now()
           WHERE customer_id = %(customer)s AND balance_cents >= %(amount)s""",
        {"amount": command.amount_cents, "customer": command.customer_id},
    ).rowcount
    if not taken:
        balance = conn.execute(
            "SELECT balance_cents FROM payments.accounts WHERE customer_id = %s", (command.customer_id,)
        ).fetchone()
        if balance is None:
            raise BusinessFailure(f"customer {command.customer_id} has no account")
        raise BusinessFailure(
            f"insufficient funds: customer {command.customer_id} has {balance[0]} cents,"
            f" order {command.order_id} needs {command.amount_cents}"
        )
    payment_id = uuid.uuid4()
    conn.execute(
        """INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status, saga_id)
           VALUES (%s, %s, %s, %s, 'charged', %s)""",
        (payment_id, command.order_id, command.customer_id, command.amount_cents, ctx.saga_id),
    )
    return {"payment_id": str(payment_id)}


@SERVICE.step(RefundPayment, lock=_order_lock)
def refund_payment(ctx: StepContext, command: RefundPayment) -> dict[str, Any]:
    """Return the order's charge to the account, once; raise :class:`AccountGone` if it is gone."""
    conn = ctx.conn
    found = conn.execute(
        "SELECT status, amount_cents, customer_id FROM payments.payments WHERE order_id = %s FOR UPDATE",
        (command.order_id,),
    ).fetchone()
    if found is None:
        conn.execute(
            """INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status, saga_id)
               VALUES (%s, %s, %s, 0, 'refunded', %s)""",
            (uuid.uuid4(), command.order_id, command.customer_id, ctx.saga_id),
        )
        return {"refunded_cents": 0}
    status, amount, customer = found
    if status == "refunded":
        return {"refunded_cents": 0}
    returned = conn.execute(
        "UPDATE payments.accounts SET balance_cents = balance_cents + %s, updated_at = now() WHERE customer_id = %s",
        (amount, customer),
    ).rowcount
    if not returned:
        raise AccountGone(
            f"cannot refund {amount} cents of order {command.order_id}: customer {customer} has no account"
        )
    conn.execute(
        "UPDATE payments.payments SET status = 'refunded', updated_at = now() WHERE order_id = %s", (command.order_id,)
    )
    return {"refunded_cents": int(amount)}


def open_accounts(conn: psycopg.Connection[Any], balances: dict[str, int]) -> int:
    """Create the accounts that do not exist yet with the given balances; return how many were created."""
    created = 0
    for customer, balance in balances.items():
        created += conn.execute(
            "INSERT INTO payments.accounts (customer_id, balance_cents) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (customer, balance),
        ).rowcount
    return created
