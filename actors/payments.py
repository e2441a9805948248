"""The Payments service: customers' accounts (an event-sourced ledger), charged and refunded once per order.

Each account is a stream of events in the payments schema (:mod:`estafeta_actors.ledger`); its
balance is their replay. The steps load the account through ``ctx.events``, record the
charge or the refund, and save it in the step's transaction, with ``payments.accounts`` (the
ledger's projection, read by the CLI, the demo and operators) written in that same
transaction. Two charges of one account racing each other conflict on the stream's
version: the second one's transaction rolls back and Dramatiq retries it.

Both steps serialise on the order id and are idempotent by the payment row's status
(one row per order, ever): a second charge returns the first payment, a second refund
changes nothing, a refused charge leaves a ``refused`` row (one decision per order: a
charge of that order retried later is refused too), and a refund that finds no charge
leaves a ``refunded`` row of 0 cents so that a charge arriving after its saga gave up on
it is refused.
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

import attrs
import psycopg
from psycopg.rows import dict_row

from estafeta import BusinessFailure, ConcurrencyConflict, Fetch, Repository, Service, Statement, StepContext

from .ledger import EVENTS, Account, AccountGone, LedgerRefusal, project, stream_of
from .migrations import MIGRATIONS

SERVICE = Service("payments", migrations=MIGRATIONS / "payments")
#: The ledger's event store, in the payments schema.
STORE = SERVICE.use_events(EVENTS, aggregates=[Account])

__all__ = [
    "SERVICE",
    "STORE",
    "AccountGone",
    "ChargePayment",
    "RefundPayment",
    "charge_payment",
    "close_account",
    "deposit",
    "open_accounts",
    "refund_payment",
]


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


def _order_lock(command: ChargePayment | RefundPayment) -> str:
    return str(command.order_id)


_PAYMENT_OF_ORDER = "SELECT payment_id, status, reason FROM payments.payments WHERE order_id = %(order_id)s"


def _payment_of_order(command: ChargePayment) -> Statement:
    """The charge's opening statement: the order's payment row, read in the step's first round trip."""
    return Statement(_PAYMENT_OF_ORDER, {"order_id": command.order_id}, Fetch.DICTS)


@SERVICE.step(ChargePayment, lock=_order_lock, opening=_payment_of_order)
def charge_payment(ctx: StepContext, command: ChargePayment) -> dict[str, Any]:
    """Charge the order once; refuse (business failure) without an account or enough money.

    In one transaction: the order's payment row is looked up, in the step's first round trip
    (its opening statement; a second charge finds it),
    the account is loaded from its events, ``MoneyWithdrawn`` is appended with the version
    it was loaded at, ``payments.accounts`` is updated and the payment row inserted. A
    concurrent charge of the same account makes the append raise ``ConcurrencyConflict``:
    the step rolls back and Dramatiq retries it on the new balance. A refusal is the order's
    one decision: it is recorded, and every later charge of the order is refused too.
    """
    conn = ctx.conn
    rows = ctx.opening
    if rows is None:  # not run: the order's lock is a Redis lock, taken after the first round trip
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(_PAYMENT_OF_ORDER, {"order_id": command.order_id}).fetchall()
    if rows:
        payment_id, status, reason = rows[0]["payment_id"], rows[0]["status"], rows[0]["reason"]
        if status == "charged":
            return {"payment_id": str(payment_id)}
        if status == "refused":
            raise BusinessFailure(f"order {command.order_id} was refused before: {reason}")
        raise BusinessFailure(f"order {command.order_id} was cancelled before it could be charged")
    account = ctx.events.get(Account, stream_of(command.customer_id))
    if account is None or not account.is_open:
        _refuse(ctx, command, f"customer {command.customer_id} has no account")
    try:
        account.withdraw(command.amount_cents, command.order_id)
    except LedgerRefusal as refusal:
        _refuse(ctx, command, str(refusal))
    ctx.events.save(account)
    project(conn, account)
    payment_id = uuid.uuid4()
    conn.execute(
        """INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status, saga_id)
           VALUES (%s, %s, %s, %s, 'charged', %s)""",
        (payment_id, command.order_id, command.customer_id, command.amount_cents, ctx.saga_id),
    )
    return {"payment_id": str(payment_id)}


def _refuse(ctx: StepContext, command: ChargePayment, reason: str) -> NoReturn:
    def record(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            """INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status, saga_id, reason)
               VALUES (%s, %s, %s, 0, 'refused', %s, %s)""",
            (uuid.uuid4(), command.order_id, command.customer_id, ctx.saga_id, reason),
        )

    ctx.on_refusal(record)
    raise BusinessFailure(reason)


@SERVICE.step(RefundPayment, lock=_order_lock)
def refund_payment(ctx: StepContext, command: RefundPayment) -> dict[str, Any]:
    """Return the order's charge to the account, once (``MoneyRefunded``); :class:`AccountGone` if it is gone."""
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
    if status in ("refunded", "refused"):
        return {"refunded_cents": 0}
    account = ctx.events.get(Account, stream_of(customer))
    if account is None or not account.is_open:
        raise AccountGone(
            f"cannot refund {amount} cents of order {command.order_id}: customer {customer} has no account"
        )
    account.refund(int(amount), command.order_id)
    ctx.events.save(account)
    project(conn, account)
    conn.execute(
        "UPDATE payments.payments SET status = 'refunded', updated_at = now() WHERE order_id = %s", (command.order_id,)
    )
    return {"refunded_cents": int(amount)}


def open_accounts(conn: psycopg.Connection[Any], balances: dict[str, int]) -> int:
    """Open the accounts that are not open yet with the given balances; return how many were opened.

    Each opening appends ``AccountOpened`` (with the balance) and writes its
    ``payments.accounts`` row, in the caller's transaction. An account opened concurrently
    by another transaction counts as already there.
    """
    accounts = Repository(STORE, Account)
    opened = 0
    for customer, balance in balances.items():
        account = accounts.get(conn, stream_of(customer)) or Account.new(stream_of(customer))
        if account.is_open:
            continue
        account.open(customer, balance)
        try:
            with conn.transaction():  # a savepoint: a conflict leaves the caller's transaction usable
                accounts.save(conn, account)
        except ConcurrencyConflict:
            continue
        project(conn, account)
        opened += 1
    return opened


def deposit(conn: psycopg.Connection[Any], customer_id: str, amount_cents: int) -> int:
    """Put money into an open account (``MoneyDeposited``), in the caller's transaction; the new balance.

    Raises :class:`~estafeta_actors.ledger.LedgerRefusal` without an open account or for an amount
    that is not positive, and ``ConcurrencyConflict`` if the account changed meanwhile.
    """
    accounts = Repository(STORE, Account)
    account = accounts.get(conn, stream_of(customer_id))
    if account is None:
        raise LedgerRefusal(f"customer {customer_id} has no account")
    account.deposit(amount_cents)
    accounts.save(conn, account)
    project(conn, account)
    return account.balance_cents


def close_account(conn: psycopg.Connection[Any], customer_id: str) -> int:
    """Close an open account (``AccountClosed``: its balance is paid out), in the caller's transaction.

    Returns the cents paid out; its ``payments.accounts`` row is deleted. A refund to a
    closed account raises :class:`AccountGone` until the account is opened again.
    """
    accounts = Repository(STORE, Account)
    account = accounts.get(conn, stream_of(customer_id))
    if account is None:
        raise LedgerRefusal(f"customer {customer_id} has no account")
    paid_out = account.balance_cents
    account.close()
    accounts.save(conn, account)
    project(conn, account)
    return paid_out
