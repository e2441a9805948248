"""The eventsourcing library's bank account example, a follower, and an estafeta service that runs it.

``BankAccounts`` is written only against the library; selecting ``estafeta.eventsourcing``
in its environment puts its events in a service schema. ``DepositTotals`` is a
``ProcessApplication`` that follows it. The ``esbank`` service's steps run the application
inside estafeta's step transaction (``conn=ctx.conn``): the events, the inbox row and the
outbox row commit together.
"""

from __future__ import annotations

import uuid
from functools import singledispatchmethod
from pathlib import Path
from typing import Any

import attrs
from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate, event
from eventsourcing.projection import EventSourcedProjection
from eventsourcing.system import ProcessApplication
from eventsourcing.utils import get_topic

from estafeta import App, BusinessFailure, Service, StepContext
from estafeta.eventsourcing import use_eventsourcing


class InsufficientFunds(Exception):
    """The account's balance is smaller than the amount."""


class BankAccount(Aggregate):
    """An account: opened by an owner, deposits and withdrawals; the balance never goes negative."""

    @event("Opened")
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.balance = 0

    @event("Deposited")
    def deposit(self, amount: int) -> None:
        self.balance += amount

    def withdraw(self, amount: int) -> None:
        if amount > self.balance:
            raise InsufficientFunds(f"account {self.id} has {self.balance}, cannot withdraw {amount}")
        self._withdrawn(amount)

    @event("Withdrawn")
    def _withdrawn(self, amount: int) -> None:
        self.balance -= amount


class BankAccounts(Application[uuid.UUID]):
    """Commands on accounts; ``**kwargs`` go to the recorder (``conn=`` joins a transaction)."""

    def open_account(self, owner: str, **kwargs: Any) -> uuid.UUID:
        account = BankAccount(owner)
        self.save(account, **kwargs)
        return account.id

    def deposit(self, account_id: uuid.UUID, amount: int, **kwargs: Any) -> None:
        account: BankAccount = self.repository.get(account_id)
        account.deposit(amount)
        self.save(account, **kwargs)

    def withdraw(self, account_id: uuid.UUID, amount: int, **kwargs: Any) -> None:
        account: BankAccount = self.repository.get(account_id)
        account.withdraw(amount)
        self.save(account, **kwargs)

    def balance(self, account_id: uuid.UUID) -> int:
        account: BankAccount = self.repository.get(account_id)
        return account.balance


class SnapshottingBankAccounts(BankAccounts):
    """The same, with a snapshot every 5 versions (taken by the library after each save, from what is committed)."""

    snapshotting_intervals = {BankAccount: 5}


class Totals(Aggregate):
    """What has been deposited into one account, as the follower counted it."""

    @staticmethod
    def create_id(account_id: uuid.UUID) -> uuid.UUID:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"/totals/{account_id}")

    @event("Started")
    def __init__(self, account_id: uuid.UUID) -> None:
        self.account_id = account_id
        self.deposited = 0

    @event("Added")
    def add(self, amount: int) -> None:
        self.deposited += amount


def count_deposit(app: Application[uuid.UUID], deposited: Any, processing_event: ProcessingEvent[uuid.UUID]) -> None:
    """Add a deposit to its account's ``Totals``, collected on the processing event (with its tracking)."""
    try:
        totals: Totals = app.repository.get(Totals.create_id(deposited.originator_id))
    except AggregateNotFoundError:
        totals = Totals(deposited.originator_id)
    totals.add(deposited.amount)
    processing_event.collect_events(totals)


def deposited_into(app: Application[uuid.UUID], account_id: uuid.UUID) -> int:
    """What ``app`` has counted into ``account_id``."""
    try:
        totals: Totals = app.repository.get(Totals.create_id(account_id))
    except AggregateNotFoundError:
        return 0
    return totals.deposited


class DepositTotals(ProcessApplication[uuid.UUID]):
    """Follows BankAccounts: each deposit adds to its account's ``Totals``, with its tracking, atomically."""

    @singledispatchmethod
    def policy(self, domain_event: Any, processing_event: ProcessingEvent[uuid.UUID]) -> None:
        """Other events change nothing."""

    @policy.register
    def _(self, domain_event: BankAccount.Deposited, processing_event: ProcessingEvent[uuid.UUID]) -> None:  # type: ignore[name-defined]
        count_deposit(self, domain_event, processing_event)

    def deposited(self, account_id: uuid.UUID) -> int:
        return deposited_into(self, account_id)


class DepositLedger(EventSourcedProjection[uuid.UUID]):
    """The same count as an event-sourced projection, fed by the library's projection runner (a subscription)."""

    topics = (get_topic(BankAccount.Deposited),)  # type: ignore[attr-defined]

    @singledispatchmethod
    def policy(self, domain_event: Any, processing_event: ProcessingEvent[uuid.UUID]) -> None:
        """Only deposits come (``topics``)."""
        count_deposit(self, domain_event, processing_event)

    def deposited(self, account_id: uuid.UUID) -> int:
        return deposited_into(self, account_id)


# --- the estafeta service that runs BankAccounts in its steps -------------------------------

esbank = Service("esbank", migrations=Path(__file__).parent / "migrations")
use_eventsourcing(esbank)
app = App("esbank", services=[esbank])

#: The BankAccounts the steps use (a test sets it; a real app builds it from its environment).
ACCOUNTS: dict[str, BankAccounts] = {}


@attrs.frozen
class Deposit:
    account_id: str
    amount: int


@attrs.frozen
class Withdraw:
    account_id: str
    amount: int


@attrs.frozen
class Receipt:
    account_id: str
    amount: int


@esbank.step(Deposit, lock=lambda c: c.account_id)
def deposit(ctx: StepContext, command: Deposit) -> None:
    """The deposit's events, this message's inbox row and the receipt's outbox row: one transaction."""
    ACCOUNTS["app"].deposit(uuid.UUID(command.account_id), command.amount, conn=ctx.conn)
    ctx.send(Receipt(command.account_id, command.amount))


@esbank.step(Withdraw, lock=lambda c: c.account_id)
def withdraw(ctx: StepContext, command: Withdraw) -> None:
    """Refused (a business failure: no events, no receipt) when the balance is too small."""
    try:
        ACCOUNTS["app"].withdraw(uuid.UUID(command.account_id), command.amount, conn=ctx.conn)
    except InsufficientFunds as exc:
        raise BusinessFailure(str(exc)) from exc
    ctx.send(Receipt(command.account_id, -command.amount))


@esbank.step(Receipt)
def receipt(ctx: StepContext, command: Receipt) -> None:
    ctx.conn.execute(
        "INSERT INTO esbank.receipts (account_id, amount, message_id) VALUES (%s, %s, %s)",
        (command.account_id, command.amount, ctx.message_id),
    )
