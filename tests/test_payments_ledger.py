"""The payments ledger: accounts are event streams, payments.accounts their exact projection.

Two charges racing on one account conflict on the stream's version and Dramatiq retries
one; the balance never goes below zero; snapshots only shorten loads; accounts that existed
before the ledger get their opening event from the migration.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import ConcurrencyConflict, Repository, Runtime, Settings, deliver
from estafeta_actors import ledger, payments
from estafeta_actors.ledger import Account, LedgerRefusal, stream_of
from estafeta_actors.payments import ChargePayment, RefundPayment
from estafeta_sql import migrate
from tests.app import STEPS

from .helpers import message_for, scalar, wait_until
from .services import scratch_database
from .shop import seed

CHARGE, REFUND = "payments.charge_payment", "payments.refund_payment"


def run(runtime: Runtime, actor: str, command: object) -> str:
    return deliver(STEPS[actor], runtime, message_for(actor, command))


def replayed(conn: psycopg.Connection[Any], *customers: str) -> dict[str, int]:
    return ledger.audit(conn, payments.STORE, customers).balances


def event_types(conn: psycopg.Connection[Any], customer: str) -> list[str]:
    rows = conn.execute(
        "SELECT type FROM payments.events WHERE stream_id = %s ORDER BY version", (stream_of(customer),)
    ).fetchall()
    return [str(r[0]) for r in rows]


def test_the_balance_is_the_replay_of_the_accounts_events_and_the_projection_follows(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {})
    charged, refunded = uuid.uuid4(), uuid.uuid4()
    assert run(runtime, CHARGE, ChargePayment(charged, "c1", 3_000)) == "ok"
    assert run(runtime, CHARGE, ChargePayment(refunded, "c1", 2_000)) == "ok"
    assert run(runtime, REFUND, RefundPayment(refunded, "c1")) == "ok"
    assert run(runtime, CHARGE, ChargePayment(uuid.uuid4(), "c1", 99_000)) == "failed"  # refused: appends nothing
    with conn.transaction():
        assert payments.deposit(conn, "c1", 500) == 7_500
    assert event_types(conn, "c1") == [
        "AccountOpened",
        "MoneyWithdrawn",
        "MoneyWithdrawn",
        "MoneyRefunded",
        "MoneyDeposited",
    ]
    assert replayed(conn, "c1") == ledger.projected_balances(conn, ["c1"]) == {"c1": 7_500}
    audit = ledger.audit(conn, payments.STORE, ["c1"])
    assert audit.charged == {charged: 3_000} and audit.deposited == 10_500
    # The charge's event names its message and the order; the step wrote it with its inbox row.
    data, metadata = conn.execute(
        "SELECT data, metadata FROM payments.events WHERE type = 'MoneyWithdrawn' ORDER BY version LIMIT 1"
    ).fetchone()
    assert data == {"amount_cents": 3_000, "order_id": str(charged)}
    assert scalar(conn, "SELECT count(*) FROM payments.inbox WHERE message_id::text = %s", metadata["causation_id"])
    # Closing pays the balance out and removes the projection's row; opening again restores one.
    with conn.transaction():
        assert payments.close_account(conn, "c1") == 7_500
    assert replayed(conn, "c1") == ledger.projected_balances(conn, ["c1"]) == {}
    with conn.transaction():
        assert payments.open_accounts(conn, {"c1": 100, "c2": 5}) == 2
        assert payments.open_accounts(conn, {"c1": 100}) == 0  # already open: left as it is
    assert replayed(conn, "c1", "c2") == ledger.projected_balances(conn, ["c1", "c2"]) == {"c1": 100, "c2": 5}


def test_a_balance_never_goes_negative_the_account_refuses_and_the_projection_checks(runtime: Runtime, conn) -> None:
    account = Account.new(stream_of("c1"))
    account.open("c1", 1_000)
    with pytest.raises(LedgerRefusal, match="insufficient funds: customer c1 has 1000 cents"):
        account.withdraw(1_001, uuid.uuid4())
    assert account.balance_cents == 1_000 and len(account.pending_events) == 1  # nothing recorded
    account.withdraw(1_000)
    assert account.balance_cents == 0
    # The projection's CHECK is the backstop behind the aggregate.
    account.balance_cents = -1
    with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
        ledger.project(conn, account)


def test_snapshots_shorten_loads_and_agree_with_the_full_replay(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 100_000}, {})
    every = Account.snapshot_every
    assert every is not None
    for _ in range(every + 3):
        assert run(runtime, CHARGE, ChargePayment(uuid.uuid4(), "c1", 100)) == "ok"
    snapshots = conn.execute("SELECT version FROM payments.snapshots WHERE stream_id = %s", (stream_of("c1"),))
    assert [r[0] for r in snapshots.fetchall()] == [every]
    expected = 100_000 - (every + 3) * 100
    loaded = Repository(payments.STORE, Account).load(conn, stream_of("c1"))
    assert (loaded.version, loaded.balance_cents) == (every + 4, expected)
    assert replayed(conn, "c1") == ledger.projected_balances(conn, ["c1"]) == {"c1": expected}


def _waiting_on_locks(conn: psycopg.Connection[Any]) -> int:
    return int(
        scalar(
            conn,
            """SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%%streams%%'""",
        )
    )


def test_two_charges_racing_on_one_account_conflict_and_dramatiq_retries_one(
    runtime: Runtime, conn, stub_broker: StubBroker, stub_worker: dramatiq.Worker, database_url: str, caplog
) -> None:
    seed(runtime, {"c1": 10_000}, {})
    first, second = uuid.uuid4(), uuid.uuid4()
    caplog.set_level(logging.INFO)
    # Hold the account's stream row: both charges load version 1 and then queue on the row
    # in their appends, so both decide on the same balance and race to save it.
    with psycopg.connect(database_url) as blocker:
        blocker.execute("SELECT 1 FROM payments.streams WHERE stream_id = %s FOR UPDATE", (stream_of("c1"),))
        for order_id, amount in ((first, 3_000), (second, 4_000)):
            stub_broker.enqueue(message_for(CHARGE, ChargePayment(order_id, "c1", amount)))
        wait_until(lambda: _waiting_on_locks(conn) == 2, timeout=10, what="both charges waiting to append")
        blocker.rollback()  # one saves; the other finds version 2 where it expected 1
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM payments.payments WHERE status = 'charged'") == 2,
        timeout=30,
        what="both orders charged",
    )
    conflicts = [r for r in caplog.records if "retried after a concurrency conflict" in r.getMessage()]
    assert conflicts, "one charge met a ConcurrencyConflict and was retried"
    # Whichever reason it gave (the version moved, or a newer transaction wrote the stream first).
    assert all(f"stream '{stream_of('c1')}'" in r.getMessage() for r in conflicts)
    versions = conn.execute("SELECT version, type FROM payments.events ORDER BY version").fetchall()
    assert versions == [(1, "AccountOpened"), (2, "MoneyWithdrawn"), (3, "MoneyWithdrawn")]
    assert replayed(conn, "c1") == ledger.projected_balances(conn, ["c1"]) == {"c1": 3_000}


def test_charges_without_the_version_check_would_lose_money(runtime: Runtime, conn, database_url: str) -> None:
    # What the conflict prevents: two charges deciding on the same loaded balance and both
    # writing it. Saved with ANY (no expected version), the second overwrites the first's
    # effect in the projection and the ledger disagrees with it.
    seed(runtime, {"c1": 10_000}, {})
    accounts = Repository(payments.STORE, Account)
    loaded = [accounts.load(conn, stream_of("c1")) for _ in range(2)]
    for account, amount in zip(loaded, (3_000, 4_000), strict=True):
        account.withdraw(amount)
        with conn.transaction():
            payments.STORE.append(conn, account.stream_id, account.pending_events)
            ledger.project(conn, account)
    assert ledger.projected_balances(conn, ["c1"]) == {"c1": 6_000}  # 3,000 cents lost
    assert replayed(conn, "c1") == {"c1": 3_000}
    # With the version check, the second save of the same loaded version is refused.
    again = [accounts.load(conn, stream_of("c1")) for _ in range(2)]
    for account in again:
        account.withdraw(100)
    with conn.transaction():
        accounts.save(conn, again[0])
    with pytest.raises(ConcurrencyConflict), conn.transaction():
        accounts.save(conn, again[1])


def test_accounts_that_existed_before_the_ledger_get_their_opening_event() -> None:
    with scratch_database() as dsn:
        every = payments.SERVICE.migrations()
        later = {m.name for m in every if m.name.startswith("_events/")} | {"payments/0003_ledger.sql"}
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn, "payments", [m for m in every if m.name not in later])
            conn.execute("INSERT INTO payments.accounts VALUES ('old1', 4200), ('old2', 0)")
            assert migrate.apply(conn, "payments", every) == sorted(later)
            assert replayed(conn, "old1", "old2") == {"old1": 4200, "old2": 0}
            assert event_types(conn, "old1") == ["AccountOpened"]
            metadata = scalar(conn, "SELECT metadata FROM payments.events WHERE stream_id = 'account-old1'")
            assert metadata == {"migrated_by": "payments/0003_ledger.sql"}
        # The steps carry on from the migrated stream.
        runtime = Runtime(Settings(database_url=dsn))
        try:
            runtime.migrate([payments.SERVICE])
            assert run(runtime, CHARGE, ChargePayment(uuid.uuid4(), "old1", 200)) == "ok"
        finally:
            runtime.close()
        with psycopg.connect(dsn) as conn:
            assert replayed(conn, "old1") == ledger.projected_balances(conn, ["old1"]) == {"old1": 4000}


def test_opening_an_account_twice_at_once_opens_it_once(runtime: Runtime, conn, database_url: str) -> None:
    opened: list[int] = []
    barrier = threading.Barrier(2, timeout=10)

    def open_one() -> None:
        with psycopg.connect(database_url) as own:
            barrier.wait()
            opened.append(payments.open_accounts(own, {"c9": 700}))
            time.sleep(0.2)  # hold the transaction: the other one queues behind it, then finds it open

    threads = [threading.Thread(target=open_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(opened) == [0, 1]
    assert event_types(conn, "c9") == ["AccountOpened"]
    assert ledger.projected_balances(conn, ["c9"]) == {"c9": 700}


def test_a_second_charge_of_an_order_finds_its_payment_under_either_lock(
    runtime: Runtime, conn, database_url: str, lock_url: str
) -> None:
    """The charge reads the order's payment in its opening statement (the PostgreSQL lock) or
    itself (a Redis lock, taken after that round trip): either way a second charge command of
    an order is answered without charging again, and a refused order stays refused."""
    from .test_locks import lock_runtime

    rt = lock_runtime(database_url, lock_url)
    try:
        seed(rt, {"c1": 5_000}, {})
        order, refused = uuid.uuid4(), uuid.uuid4()
        assert run(rt, CHARGE, ChargePayment(order, "c1", 3_000)) == "ok"
        assert run(rt, CHARGE, ChargePayment(order, "c1", 3_000)) == "ok"  # another message, the same order
        assert scalar(conn, "SELECT count(*) FROM payments.payments WHERE order_id = %s", order) == 1
        assert ledger.projected_balances(conn, ["c1"]) == {"c1": 2_000}
        assert run(rt, CHARGE, ChargePayment(refused, "c1", 9_000)) == "failed"
        assert run(rt, CHARGE, ChargePayment(refused, "c1", 1_000)) == "failed"  # refused before: still refused
        assert ledger.projected_balances(conn, ["c1"]) == {"c1": 2_000}
    finally:
        rt.close()
