"""The payments ledger: each customer's account as a stream of events (seed 000's bank account).

The balance is not stored anywhere as the truth: it is the replay of the account's events,
``AccountOpened`` (with its opening balance), ``MoneyDeposited``, ``MoneyWithdrawn`` (an
order's charge), ``MoneyRefunded`` (its compensation) and ``AccountClosed`` (the balance paid
out). :class:`Account` refuses what would take a balance below zero. ``payments.accounts`` is
the projection of the ledger that readers query (same columns as before the ledger); the
payments steps write it in the transaction that appends the events (:func:`project`).
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterable
from typing import Any

import attrs
import psycopg

from estafeta import Aggregate, BusinessFailure, EstafetaError, EventRegistry, EventStore, applies

#: The ledger's event types, stored under these names in ``payments.events``.
EVENTS = EventRegistry()


@EVENTS.event("AccountOpened")
@attrs.frozen
class AccountOpened:
    """The account exists, with ``balance_cents`` in it (an opening deposit, possibly 0)."""

    customer_id: str
    balance_cents: int


@EVENTS.event("MoneyDeposited")
@attrs.frozen
class MoneyDeposited:
    """Money put into the account (from outside the order system)."""

    amount_cents: int


@EVENTS.event("MoneyWithdrawn")
@attrs.frozen
class MoneyWithdrawn:
    """Money taken from the account: an order's charge (``order_id``), or a plain withdrawal."""

    amount_cents: int
    order_id: uuid.UUID | None = None


@EVENTS.event("MoneyRefunded")
@attrs.frozen
class MoneyRefunded:
    """An order's charge given back (the compensation of its ``MoneyWithdrawn``)."""

    amount_cents: int
    order_id: uuid.UUID


@EVENTS.event("AccountClosed")
@attrs.frozen
class AccountClosed:
    """The account is closed and its balance, ``paid_out_cents``, left the ledger; it may be opened again."""

    paid_out_cents: int


class AccountGone(EstafetaError):
    """The money of a refund has no account to go back to.

    Not a business failure: retrying cannot help until an operator opens the account again,
    so the refund is retried, then parked, and its saga ends ``failed`` for the operator.
    """


class LedgerRefusal(BusinessFailure):
    """The account refuses the change (no such account, not enough money, a bad amount)."""


def stream_of(customer_id: str) -> str:
    """The id of the customer's account stream."""
    return f"account-{customer_id}"


@attrs.define
class Account(Aggregate):
    """A customer's account: its balance is the sum of its events; it never goes below zero."""

    schema_version = 1
    #: A busy account is loaded from its latest snapshot plus at most this many events.
    snapshot_every = 50

    customer_id: str = ""
    balance_cents: int = 0
    is_open: bool = False

    def open(self, customer_id: str, balance_cents: int) -> None:
        """Open the account (again, if it was closed) with an opening balance."""
        if self.is_open:
            raise LedgerRefusal(f"customer {customer_id} already has an account")
        if balance_cents < 0:
            raise LedgerRefusal(f"cannot open an account with {balance_cents} cents")
        self.record(AccountOpened(customer_id, balance_cents))

    def deposit(self, amount_cents: int) -> None:
        """Put money in."""
        self._check_open("a deposit")
        if amount_cents <= 0:
            raise LedgerRefusal(f"cannot deposit {amount_cents} cents to customer {self.customer_id}")
        self.record(MoneyDeposited(amount_cents))

    def withdraw(self, amount_cents: int, order_id: uuid.UUID | None = None) -> None:
        """Take money out (an order's charge); refused if the balance would go below zero."""
        self._check_open("a withdrawal")
        if amount_cents < 0:
            raise LedgerRefusal(f"cannot withdraw {amount_cents} cents from customer {self.customer_id}")
        if amount_cents > self.balance_cents:
            needs = f"order {order_id} needs" if order_id else "the withdrawal needs"
            raise LedgerRefusal(
                f"insufficient funds: customer {self.customer_id} has {self.balance_cents} cents,"
                f" {needs} {amount_cents}"
            )
        self.record(MoneyWithdrawn(amount_cents, order_id))

    def refund(self, amount_cents: int, order_id: uuid.UUID) -> None:
        """Give an order's charge back; :class:`AccountGone` if the account is closed."""
        if not self.is_open:
            raise AccountGone(
                f"cannot refund {amount_cents} cents of order {order_id}: customer {self.customer_id} has no account"
            )
        self.record(MoneyRefunded(amount_cents, order_id))

    def close(self) -> None:
        """Close the account, paying its balance out."""
        self._check_open("closing")
        self.record(AccountClosed(self.balance_cents))

    def _check_open(self, what: str) -> None:
        if not self.is_open:
            raise LedgerRefusal(f"customer {self.customer_id} has no account for {what}")

    @applies(AccountOpened)
    def _opened(self, event: AccountOpened) -> None:
        self.customer_id, self.balance_cents, self.is_open = event.customer_id, event.balance_cents, True

    @applies(MoneyDeposited)
    def _deposited(self, event: MoneyDeposited) -> None:
        self.balance_cents += event.amount_cents

    @applies(MoneyWithdrawn)
    def _withdrawn(self, event: MoneyWithdrawn) -> None:
        self.balance_cents -= event.amount_cents

    @applies(MoneyRefunded)
    def _refunded(self, event: MoneyRefunded) -> None:
        self.balance_cents += event.amount_cents

    @applies(AccountClosed)
    def _closed(self, event: AccountClosed) -> None:
        self.balance_cents, self.is_open = 0, False


def project(conn: psycopg.Connection[Any], account: Account) -> None:
    """Write ``payments.accounts`` for ``account`` as just saved, in the caller's transaction.

    Called in the transaction that appended the account's events: the append holds the
    stream's row lock to the commit, so the projection's row is written in the ledger's order
    and always equals the replay. A closed account has no row (as before the ledger).
    """
    if account.is_open:
        conn.execute(
            """INSERT INTO payments.accounts (customer_id, balance_cents) VALUES (%s, %s)
               ON CONFLICT (customer_id) DO UPDATE SET balance_cents = excluded.balance_cents, updated_at = now()""",
            (account.customer_id, account.balance_cents),
        )
    else:
        conn.execute("DELETE FROM payments.accounts WHERE customer_id = %s", (account.customer_id,))


@attrs.frozen
class LedgerAudit:
    """What the ledger's events say, replayed from the first event (no snapshot) for some customers."""

    #: Replayed balance of each customer's open account (closed or never opened: absent).
    balances: dict[str, int]
    #: Opening balances and deposits, in cents.
    deposited: int
    #: Net cents charged per order (withdrawn minus refunded), orders netting zero left out.
    charged: dict[uuid.UUID, int]
    #: Events replayed.
    events: int


def audit(conn: psycopg.Connection[Any], store: EventStore, customers: Iterable[str]) -> LedgerAudit:
    """Replay the accounts of ``customers`` from their events alone (snapshots are not used)."""
    balances: dict[str, int] = {}
    charged: collections.Counter[uuid.UUID] = collections.Counter()
    deposited = events = 0
    for customer in customers:
        account = Account.new(stream_of(customer))
        for recorded in store.read(conn, stream_of(customer)):
            event = recorded.event
            account.record(event)
            events += 1
            if isinstance(event, AccountOpened):
                deposited += event.balance_cents
            elif isinstance(event, MoneyDeposited):
                deposited += event.amount_cents
            elif isinstance(event, MoneyWithdrawn) and event.order_id is not None:
                charged[event.order_id] += event.amount_cents
            elif isinstance(event, MoneyRefunded):
                charged[event.order_id] -= event.amount_cents
        if account.is_open:
            balances[customer] = account.balance_cents
    return LedgerAudit(balances, deposited, {o: c for o, c in charged.items() if c}, events)


def projected_balances(conn: psycopg.Connection[Any], customers: Iterable[str]) -> dict[str, int]:
    """The ``payments.accounts`` balances of ``customers`` (those with a row)."""
    rows = conn.execute(
        "SELECT customer_id, balance_cents FROM payments.accounts WHERE customer_id = ANY(%s)", (list(customers),)
    ).fetchall()
    return {str(customer): int(balance) for customer, balance in rows}
