"""A small app with an event-sourced service, for the step and CLI tests: ``--app tests.events.ledger``.

``ledger`` keeps accounts as event streams: a ``Deposit`` step loads the account, records
``MoneyDeposited``, saves it with the expected version and sends ``Noted`` through the
outbox, all in the step's one transaction; ``Balances`` projects the balances.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import attrs

from estafeta import (
    Aggregate,
    App,
    BusinessFailure,
    EventRegistry,
    Projection,
    ProjectionContext,
    RecordedEvent,
    Service,
    StepContext,
    applies,
    handles,
)

events = EventRegistry()


@events.event("MoneyDeposited")
@attrs.frozen
class MoneyDeposited:
    amount: int


@attrs.define
class Account(Aggregate):
    snapshot_every = 5
    balance: int = 0

    def deposit(self, amount: int) -> None:
        if amount <= 0:
            raise BusinessFailure(f"cannot deposit {amount}")
        self.record(MoneyDeposited(amount))

    @applies(MoneyDeposited)
    def _deposited(self, event: MoneyDeposited) -> None:
        self.balance += event.amount


class Balances(Projection):
    name = "balances"
    tables: ClassVar[dict[str, str]] = {
        "balances": "CREATE TABLE {balances} (account text PRIMARY KEY, balance bigint NOT NULL)"
    }

    @handles(MoneyDeposited)
    def deposited(self, ctx: ProjectionContext, recorded: RecordedEvent[MoneyDeposited]) -> None:
        ctx.execute(
            "INSERT INTO {balances} AS b VALUES (%s, %s)"
            " ON CONFLICT (account) DO UPDATE SET balance = b.balance + excluded.balance",
            (recorded.stream_id, recorded.event.amount),
        )


@attrs.frozen
class Deposit:
    account: str
    amount: int
    #: Wait for a second deposit to have loaded the same version before saving (the conflict test).
    rendezvous: bool = False


@attrs.frozen
class Noted:
    account: str


ledger = Service("ledger")
ledger.use_events(events, aggregates=[Account])
ledger.projection(Balances())
app = App("ledger", services=[ledger])

#: Two first attempts of rendezvous deposits meet here, both having loaded the account.
RENDEZVOUS = threading.Barrier(2, timeout=10)
_met = threading.Event()


@ledger.step(Deposit)
def deposit(ctx: StepContext, command: Deposit) -> None:
    stream = f"account-{command.account}"
    account = ctx.events.get(Account, stream) or Account.new(stream)
    if command.rendezvous and not _met.is_set():
        RENDEZVOUS.wait()
        _met.set()
    account.deposit(command.amount)
    ctx.events.save(account)
    ctx.send(Noted(command.account))


@ledger.step(Noted)
def noted(ctx: StepContext, command: Noted) -> Any:
    return None
