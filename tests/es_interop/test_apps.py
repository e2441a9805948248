"""eventsourcing applications end to end on estafeta's store: state, snapshots, outbox, steps, a follower."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.es_interop.support import drop_schema, require_eventsourcing

require_eventsourcing()

from dramatiq.brokers.stub import StubBroker  # noqa: E402
from eventsourcing.cipher import AESCipher  # noqa: E402
from eventsourcing.persistence import IntegrityError  # noqa: E402
from eventsourcing.system import SingleThreadedRunner, System  # noqa: E402

from estafeta import Outcome, Runtime, deliver, running  # noqa: E402
from tests.helpers import message_for, scalar, wait_until  # noqa: E402

from . import bank  # noqa: E402
from .bank import (  # noqa: E402
    BankAccount,
    BankAccounts,
    DepositTotals,
    InsufficientFunds,
    SnapshottingBankAccounts,
)


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    """A new schema, dropped afterwards."""
    name = f"es_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(database_url, name)


def env(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    return {
        "PERSISTENCE_MODULE": "estafeta.eventsourcing",
        "ESTAFETA_DATABASE_URL": dsn,
        "ESTAFETA_SCHEMA": schema,
        **extra,
    }


def test_an_app_keeps_its_events_as_estafeta_events(database_url: str, schema: str) -> None:
    accounts = SnapshottingBankAccounts(env=env(database_url, schema))
    try:
        account = accounts.open_account("ann")
        for amount in (10, 20, 30, 40, 50, 60):
            accounts.deposit(account, amount)
        accounts.withdraw(account, 100)
        with pytest.raises(InsufficientFunds):
            accounts.withdraw(account, 1000)
        assert accounts.balance(account) == 110
    finally:
        accounts.close()

    again = SnapshottingBankAccounts(env=env(database_url, schema))  # another process, say
    try:
        assert again.balance(account) == 110
        assert [n.originator_version for n in again.notification_log.select(start=1, limit=10)] == list(range(1, 9))
    finally:
        again.close()

    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT version, type, data->>'amount', jsonb_typeof(data) FROM {schema}.events"
            " WHERE stream_id = %s ORDER BY version",
            (str(account),),
        ).fetchall()
        # originator versions 1..8 are the stream's versions 2..9; states are JSON objects SQL can read
        assert [r[0] for r in rows] == list(range(2, 10))
        assert rows[1][1] == "tests.es_interop.bank:BankAccount.Deposited" and rows[1][2] == "10"
        assert {r[3] for r in rows} == {"object"}
        assert scalar(conn, f"SELECT version FROM {schema}.streams WHERE stream_id = %s", str(account)) == 9
        # the library's snapshot, every 5 versions, kept byte for byte in its own table
        assert scalar(conn, f"SELECT array_agg(originator_version) FROM {schema}.eventsourcing_snapshots") == [5]


def test_two_writers_of_one_account_conflict(database_url: str, schema: str) -> None:
    first, second = BankAccounts(env=env(database_url, schema)), BankAccounts(env=env(database_url, schema))
    try:
        account_id = first.open_account("bo")
        mine: BankAccount = first.repository.get(account_id)
        theirs: BankAccount = second.repository.get(account_id)
        mine.deposit(5)
        first.save(mine)
        theirs.deposit(7)
        with pytest.raises(IntegrityError):
            second.save(theirs)
        assert second.balance(account_id) == 5
    finally:
        first.close()
        second.close()


def test_compressed_and_encrypted_states_round_trip(database_url: str, schema: str) -> None:
    secret = env(
        database_url,
        schema,
        COMPRESSOR_TOPIC="eventsourcing.compressor:ZlibCompressor",
        CIPHER_TOPIC="eventsourcing.cipher:AESCipher",
        CIPHER_KEY=AESCipher.create_key(16),
    )
    accounts = BankAccounts(env=secret)
    try:
        account = accounts.open_account("cy")
        accounts.deposit(account, 42)
        assert accounts.balance(account) == 42
    finally:
        accounts.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        kinds = conn.execute(f"SELECT DISTINCT jsonb_typeof(data) FROM {schema}.events").fetchall()
    assert kinds == [("string",)]  # base64 of the encrypted bytes


@pytest.fixture
def esbank(runtime: Runtime, database_url: str) -> Iterator[BankAccounts]:
    """The esbank service migrated by estafeta (``use_eventsourcing``), and BankAccounts on its schema."""
    bank.app.migrate(runtime)
    accounts = BankAccounts(env=env(database_url, "esbank", CREATE_TABLE="no"))
    bank.ACCOUNTS["app"] = accounts
    yield accounts
    bank.ACCOUNTS.clear()
    accounts.close()


def _outbox_rows(dsn: str, message_id: uuid.UUID) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(scalar(conn, "SELECT count(*) FROM esbank.outbox WHERE message_id = %s", message_id))


def test_events_and_an_outbox_row_commit_together(esbank: BankAccounts, database_url: str) -> None:
    account = esbank.open_account("di")
    with psycopg.connect(database_url) as conn:  # one transaction, committed when the block ends
        esbank.deposit(account, 25, conn=conn)
        sent = bank.esbank.send(conn, bank.Receipt(str(account), 25))
        assert esbank.balance(account) == 0 and _outbox_rows(database_url, sent) == 0  # nothing visible yet
    assert esbank.balance(account) == 25 and _outbox_rows(database_url, sent) == 1

    with pytest.raises(RuntimeError), psycopg.connect(database_url) as conn:
        esbank.deposit(account, 5, conn=conn)
        lost = bank.esbank.send(conn, bank.Receipt(str(account), 5))
        raise RuntimeError("the caller's transaction rolls back")
    assert esbank.balance(account) == 25 and _outbox_rows(database_url, lost) == 0


def test_a_conflict_in_the_callers_transaction_leaves_it_usable(esbank: BankAccounts, database_url: str) -> None:
    account_id = esbank.open_account("ed")
    stale: BankAccount = esbank.repository.get(account_id)
    esbank.deposit(account_id, 1)  # someone else moves the account on
    stale.deposit(2)
    with psycopg.connect(database_url) as conn:
        with pytest.raises(IntegrityError):
            esbank.save(stale, conn=conn)
        sent = bank.esbank.send(conn, bank.Receipt(str(account_id), 0))
    assert _outbox_rows(database_url, sent) == 1 and esbank.balance(account_id) == 1


def test_an_autocommit_connection_is_refused(esbank: BankAccounts, database_url: str) -> None:
    account_id = esbank.open_account("flo")
    with psycopg.connect(database_url, autocommit=True) as conn, pytest.raises(ValueError, match="transaction"):
        esbank.deposit(account_id, 1, conn=conn)


def _receipts(dsn: str, account: uuid.UUID) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT amount FROM esbank.receipts WHERE account_id = %s ORDER BY amount", (str(account),))
        return [r[0] for r in rows.fetchall()]


def test_steps_run_the_app_with_the_inbox_and_the_outbox(esbank: BankAccounts, runtime: Runtime) -> None:
    account = esbank.open_account("gus")
    binding = bank.app.bind(StubBroker(), runtime)
    with running(binding):
        with runtime.database("esbank").transaction() as conn:
            bank.esbank.send(conn, bank.Deposit(str(account), 40))
            bank.esbank.send(conn, bank.Withdraw(str(account), 500))  # refused: no events, no receipt
        wait_until(lambda: _receipts(runtime.settings.database_url, account) == [40], what="the deposit's receipt")
    assert esbank.balance(account) == 40

    spec = bank.esbank.steps["esbank.deposit"]
    again = message_for("esbank.deposit", bank.Deposit(str(account), 15))
    assert deliver(spec, runtime, again) == Outcome.OK
    assert deliver(spec, runtime, again) == Outcome.DUPLICATE  # the inbox: no second deposit
    assert esbank.balance(account) == 55
    refused = message_for("esbank.withdraw", bank.Withdraw(str(account), 500))
    assert deliver(bank.esbank.steps["esbank.withdraw"], runtime, refused) == Outcome.FAILED
    assert esbank.balance(account) == 55


def test_a_process_application_follows_with_its_tracking(database_url: str, schema: str) -> None:
    system = System(pipes=[[BankAccounts, DepositTotals]])
    follower_schema = f"{schema}_f"
    settings = {
        "PERSISTENCE_MODULE": "estafeta.eventsourcing",
        "ESTAFETA_DATABASE_URL": database_url,
        "BANKACCOUNTS_ESTAFETA_SCHEMA": schema,
        "DEPOSITTOTALS_ESTAFETA_SCHEMA": follower_schema,
    }
    try:
        runner: SingleThreadedRunner[uuid.UUID] = SingleThreadedRunner(system, env=settings)
        runner.start()
        accounts, totals = runner.get(BankAccounts), runner.get(DepositTotals)
        account = accounts.open_account("hal")
        accounts.deposit(account, 10)
        accounts.deposit(account, 20)
        assert totals.deposited(account) == 30
        last = accounts.recorder.max_notification_id()
        assert totals.recorder.max_tracking_id("BankAccounts") == last
        runner.stop()

        # a restarted follower resumes after its tracked position: nothing is counted twice
        runner = SingleThreadedRunner(system, env=settings)
        runner.start()
        runner.get(BankAccounts).deposit(account, 5)
        assert runner.get(DepositTotals).deposited(account) == 35
        runner.stop()
    finally:
        drop_schema(database_url, follower_schema)
