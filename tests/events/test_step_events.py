"""Events appended by steps: one transaction with the inbox and the outbox, conflicts retried by Dramatiq, the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from prometheus_client import REGISTRY

from estafeta import Repository, Runtime, Settings, running

from ..helpers import scalar, wait_until
from ..integration.processes import ROOT, service_env
from ..services import scratch_database
from .ledger import Account, Deposit, app, ledger

#: Failed attempts of the deposit step (each one retried by Dramatiq).
ERRORS = {"actor": "ledger.deposit", "outcome": "error"}


@pytest.fixture
def dsn() -> Iterator[str]:
    with scratch_database() as found:
        yield found


@pytest.fixture
def runtime(dsn: str) -> Iterator[Runtime]:
    runtime = Runtime(Settings(database_url=dsn, max_retries=5, min_backoff_ms=10, max_backoff_ms=50))
    app.migrate(runtime)
    yield runtime
    runtime.close()


def deposit(runtime: Runtime, *commands: Deposit) -> None:
    with runtime.database("ledger").transaction() as conn:
        for command in commands:
            ledger.send(conn, command)


def test_a_step_appends_its_events_with_its_inbox_row_and_outbox_rows(runtime: Runtime) -> None:
    binding = app.bind(StubBroker(), runtime)
    with running(binding), runtime.database("ledger").connection() as conn:
        deposit(runtime, Deposit("ann", 30), Deposit("bob", -5))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 1)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.dead_letters") == 1, what="the refusal")
        [row] = conn.execute("SELECT stream_id, version, metadata FROM ledger.events").fetchall()
        processed = scalar(
            conn,
            "SELECT message_id::text FROM ledger.inbox WHERE consumer = 'ledger.deposit' AND message_id::text = %s",
            row[2]["causation_id"],
        )
        assert row[:2] == ("account-ann", 1) and processed == row[2]["causation_id"]
        assert row[2]["traceparent"].startswith("00-")
        # bob's refused deposit appended nothing and sent nothing: its events went with the step's work.
        assert scalar(conn, "SELECT count(*) FROM ledger.streams WHERE stream_id = 'account-bob'") == 0
        assert scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 1
        # The worker runs the app's projectors too (as it runs the saga watchdog).
        wait_until(lambda: _balances(runtime.dsn_for("ledger")) == {"account-ann": 30}, timeout=60, what="Balances")


def test_two_deposits_racing_on_one_account_conflict_and_dramatiq_retries_one(runtime: Runtime) -> None:
    binding = app.bind(StubBroker(), runtime)
    errors = REGISTRY.get_sample_value("estafeta_step_deliveries_total", ERRORS)
    with running(binding), runtime.database("ledger").connection() as conn:
        deposit(runtime, Deposit("ann", 10))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 1)
        deposit(runtime, Deposit("ann", 20, rendezvous=True), Deposit("ann", 40, rendezvous=True))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 3)
        versions = [r[0] for r in conn.execute("SELECT version FROM ledger.events ORDER BY version").fetchall()]
        assert versions == [1, 2, 3]
        assert ledger.event_store is not None
        assert Repository(ledger.event_store, Account).load(conn, "account-ann").balance == 70
    after = REGISTRY.get_sample_value("estafeta_step_deliveries_total", ERRORS)
    assert (after or 0) - (errors or 0) >= 1, "one of the two saw a ConcurrencyConflict and was retried"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", "--app", "tests.events.ledger", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.heavy
def test_the_projection_and_event_commands(dsn: str, runtime: Runtime) -> None:
    env = service_env(dsn, "stub://")
    binding = app.bind(StubBroker(), runtime, projectors=False)  # `projections run` below does the projecting
    with running(binding), runtime.database("ledger").connection() as conn:
        deposit(runtime, Deposit("ann", 30), Deposit("bob", 7))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 2)
        deposit(runtime, Deposit("ann", 12))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'") == 3)
    projector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "estafeta_cli",
            "--app",
            "tests.events.ledger",
            "projections",
            "run",
            "--poll-interval",
            "0.1",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_until(lambda: _balances(dsn) == {"account-ann": 42, "account-bob": 7}, timeout=60, what="the projection")
    finally:
        projector.send_signal(signal.SIGTERM)
        assert projector.wait(timeout=30) == 0
    status = json.loads(cli(env, "projections", "status", "--json").stdout)
    [balances] = status["projections"]
    assert (balances["name"], balances["state"], balances["lag_events"]) == ("balances", "stopped", 0)
    shown = cli(env, "events", "show", "account-ann", "--version", "1", "--json")
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    assert [e["data"] for e in body["events"]] == [{"amount": 30}] and body["state"]["balance"] == 30
    text = cli(env, "events", "show", "account-ann").stdout
    assert "MoneyDeposited" in text and '"balance": 42' in text
    rebuilt = cli(env, "projections", "rebuild", "balances")
    assert rebuilt.returncode == 0 and "rebuilt from 3 events" in rebuilt.stdout, rebuilt.stderr
    assert _balances(dsn) == {"account-ann": 42, "account-bob": 7}
    for args, message in [
        (("events", "show", "account-zed"), "stream 'account-zed' has no event"),
        (("events", "show", "account-ann", "--as-of", "yesterday"), "is not an ISO 8601 time"),
        (("projections", "rebuild", "nope"), "0 projections named 'nope'"),
    ]:
        result = cli(env, *args)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, result


def _balances(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        try:
            return dict(conn.execute("SELECT account, balance FROM ledger.balances").fetchall())  # type: ignore[arg-type]
        except psycopg.errors.UndefinedTable:
            return {}
