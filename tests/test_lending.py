"""The docs' event-sourced example (examples/lending): a step's events, inbox row and outbox row commit together.

Real PostgreSQL (a scratch database per test), the StubBroker for the broker. Single
deliveries go through :func:`estafeta.deliver`, exactly what the worker's actor runs;
the flows run a Dramatiq worker and the relay in this process (:func:`estafeta.running`).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from prometheus_client import REGISTRY

import examples.lending as lending_example
from estafeta import (
    ConcurrencyConflict,
    DatabaseError,
    Outcome,
    Projector,
    Runtime,
    Settings,
    deliver,
    run_projectors,
    running,
)
from examples.lending import BooksOnLoan, LendBook, ReturnBook, add_book, app, book_id, lending, store

from .helpers import message_for, scalar, wait_until, without_docstrings
from .integration import processes
from .integration.processes import BIN, ROOT, service_env
from .services import scratch_database


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


@pytest.fixture
def conn(dsn: str, runtime: Runtime) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


def shelve(runtime: Runtime, *books: tuple[str, str]) -> None:
    with runtime.database("lending").transaction() as tx:
        for book_id, title in books:
            add_book(tx, book_id, title)


def send(runtime: Runtime, *commands: Any) -> None:
    with runtime.database("lending").transaction() as tx:
        for command in commands:
            lending.send(tx, command)


def history(conn: psycopg.Connection[Any], book_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = conn.execute(
        "SELECT type, data FROM lending.events WHERE stream_id = %s ORDER BY version", (f"book-{book_id}",)
    ).fetchall()
    return [(kind, data) for kind, data in rows]


def deliveries(outcome: str) -> float:
    found = REGISTRY.get_sample_value(
        "estafeta_step_deliveries_total", {"actor": "lending.lend_book", "outcome": outcome}
    )
    return found or 0.0


def test_the_loan_its_inbox_row_and_its_reminder_request_commit_in_one_transaction(runtime, conn) -> None:
    shelve(runtime, ("b1", "Dune"))
    message = message_for("lending.lend_book", LendBook("b1", "ann"))
    assert deliver(lending_example.lend_book, runtime, message) is Outcome.OK
    [(kind, data)] = history(conn, "b1")[1:]
    assert kind == "BookLent" and data["member"] == "ann"
    metadata = scalar(conn, "SELECT metadata FROM lending.events WHERE stream_id = 'book-b1' AND version = 2")
    assert metadata["causation_id"] == message.message_id
    [(actor, args)] = conn.execute("SELECT actor_name, message->'args'->0 FROM lending.outbox").fetchall()
    assert actor == "reminders.schedule_reminder"
    assert (args["book_id"], args["loan"], args["member"]) == ("b1", 1, "ann")
    # The event's transaction is the one that wrote the inbox row: it carries the top transaction's id
    # (the row's xmin is its low 32 bits). The outbox row was written in the savepoint around the
    # step's function, a subtransaction with an id of its own: the next test shows it goes with the events.
    event_tx = scalar(conn, "SELECT (tx_id::text::bigint %% 4294967296)::text FROM lending.events WHERE version = 2")
    assert event_tx == scalar(conn, "SELECT xmin::text FROM lending.inbox WHERE message_id = %s", message.message_id)


def test_a_step_failing_after_its_append_leaves_neither_its_events_nor_its_outbox_row(runtime, conn) -> None:
    shelve(runtime, ("b1", "Dune"))
    # The outbox insert fails, after the append: the error says what the step's transaction saw then.
    conn.execute(
        "CREATE FUNCTION lending.outbox_down() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " RAISE EXCEPTION 'outbox down; events so far: %', (SELECT count(*) FROM lending.events); END $$;"
        "CREATE TRIGGER outbox_down BEFORE INSERT ON lending.outbox FOR EACH ROW EXECUTE FUNCTION lending.outbox_down()"
    )
    message = message_for("lending.lend_book", LendBook("b1", "ann"))
    with pytest.raises(DatabaseError, match="outbox down; events so far: 2"):
        deliver(lending_example.lend_book, runtime, message)
    assert [kind for kind, _ in history(conn, "b1")] == ["BookAdded"]
    assert scalar(conn, "SELECT version FROM lending.streams WHERE stream_id = 'book-b1'") == 1
    assert scalar(conn, "SELECT count(*) FROM lending.outbox") == 0
    assert scalar(conn, "SELECT count(*) FROM lending.inbox") == 0
    conn.execute("DROP TRIGGER outbox_down ON lending.outbox")
    assert deliver(lending_example.lend_book, runtime, message) is Outcome.OK  # Dramatiq's retry
    assert [kind for kind, _ in history(conn, "b1")] == ["BookAdded", "BookLent"]
    assert scalar(conn, "SELECT count(*) FROM lending.outbox") == 1


def test_a_duplicate_delivery_appends_once_and_sends_once(runtime, conn) -> None:
    shelve(runtime, ("b1", "Dune"))
    message = message_for("lending.lend_book", LendBook("b1", "ann"))
    assert deliver(lending_example.lend_book, runtime, message) is Outcome.OK
    assert deliver(lending_example.lend_book, runtime, message) is Outcome.DUPLICATE
    assert [kind for kind, _ in history(conn, "b1")] == ["BookAdded", "BookLent"]
    assert scalar(conn, "SELECT count(*) FROM lending.outbox") == 1
    # A refusal appends nothing either: the book is out, and "b2" was never added.
    for refused in (LendBook("b1", "bob"), LendBook("b2", "bob")):
        assert deliver(lending_example.lend_book, runtime, message_for("lending.lend_book", refused)) is Outcome.FAILED
    assert scalar(conn, "SELECT count(*) FROM lending.events") == 2
    assert scalar(conn, "SELECT count(*) FROM lending.outbox") == 1
    assert [r[0] for r in conn.execute("SELECT reason FROM lending.dead_letters ORDER BY id").fetchall()] == [
        "business failure: 'Dune' is on loan to ann",
        "business failure: there is no book b2",
    ]


def test_a_book_is_added_once(runtime, conn) -> None:
    shelve(runtime, ("b1", "Dune"))
    with pytest.raises(ConcurrencyConflict):
        shelve(runtime, ("b1", "Dune, again"))
    assert history(conn, "b1") == [("BookAdded", {"title": "Dune"})]


def test_two_loans_racing_for_one_book_conflict_and_the_retry_is_refused(runtime, conn, dsn) -> None:
    shelve(runtime, ("b1", "Dune"))
    errors, refusals = deliveries("error"), deliveries("failed")
    with running(app.bind(StubBroker(), runtime, projectors=False)), psycopg.connect(dsn) as holder:
        # Hold the book's stream row: both steps load version 1, record their loan, and wait to save.
        holder.execute("SELECT 1 FROM lending.streams WHERE stream_id = 'book-b1' FOR UPDATE")
        send(runtime, LendBook("b1", "ann"), LendBook("b1", "bob"))
        wait_until(lambda: _waiting_on_a_lock(conn) == 2, what="both loans to wait on the book's stream")
        holder.rollback()
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM lending.inbox") == 2, what="both loans processed")
        assert [kind for kind, _ in history(conn, "b1")] == ["BookAdded", "BookLent"], "one loan, not two"
        lent = history(conn, "b1")[1][1]
        assert lent["member"] in {"ann", "bob"}
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM lending.outbox") == 0, what="the relay")
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM reminders.inbox") == 1, what="the reminder")
    assert conn.execute("SELECT book_id, loan, member FROM reminders.reminders").fetchall() == [
        ("b1", 1, lent["member"])
    ]
    assert deliveries("error") - errors >= 1, "the second save conflicted, and Dramatiq retried it"
    assert deliveries("failed") - refusals == 1, "the retry found the book out and refused"
    loser = ({"ann", "bob"} - {lent["member"]}).pop()
    assert (
        scalar(conn, "SELECT reason FROM lending.dead_letters")
        == f"business failure: 'Dune' is on loan to {lent['member']}"
    )
    assert scalar(conn, "SELECT message->'args'->0->>'member' FROM lending.dead_letters") == loser


def _waiting_on_a_lock(conn: psycopg.Connection[Any]) -> int:
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
    )


def test_books_on_loan_catches_up_with_loans_and_returns(runtime, conn, dsn) -> None:
    shelve(runtime, ("b1", "Dune"), ("b2", "Emma"), ("b3", "Ulysses"))
    stop = threading.Event()
    projectors = threading.Thread(
        target=run_projectors, args=(dsn, [Projector(BooksOnLoan(), store)], stop), kwargs={"poll_interval": 0.1}
    )
    with running(app.bind(StubBroker(), runtime, projectors=False)):
        send(runtime, LendBook("b1", "ann"), LendBook("b2", "bob", days=7))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM reminders.inbox") == 2, what="two reminders")
        projectors.start()  # behind by two loans
        try:
            wait_until(lambda: _on_loan(conn) == {"b1": "ann", "b2": "bob"}, what="the projection to catch up")
            send(runtime, ReturnBook("b1"))
            wait_until(lambda: _on_loan(conn) == {"b2": "bob"}, what="the return")
            send(runtime, LendBook("b1", "cy"))
            wait_until(lambda: _on_loan(conn) == {"b1": "cy", "b2": "bob"}, what="the second loan of b1")
        finally:
            stop.set()
            projectors.join(timeout=30)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM reminders.inbox") == 4, what="the reminders")
    reminders = conn.execute(
        "SELECT book_id, loan, member, cancelled FROM reminders.reminders ORDER BY 1, 2"
    ).fetchall()
    assert reminders == [("b1", 1, "ann", True), ("b1", 2, "cy", False), ("b2", 1, "bob", False)]
    due = dict(conn.execute("SELECT book_id, due FROM lending.books_on_loan").fetchall())
    assert round((due["b1"] - due["b2"]) / timedelta(days=1)) == 14  # cy's 21 days against bob's 7, seconds apart


def _on_loan(conn: psycopg.Connection[Any]) -> dict[str, str]:
    try:
        return dict(conn.execute("SELECT book_id, member FROM lending.books_on_loan").fetchall())
    except psycopg.errors.UndefinedTable:
        return {}


def estafeta(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``estafeta --app examples.lending ARGS`` from the repository's root, as the docs run it."""
    command = [str(BIN / "estafeta"), "--app", "examples.lending", *args]
    env = service_env(dsn, "stub://")
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_estafeta_commands_manage_the_example(dsn: str) -> None:
    migrated = estafeta(dsn, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "lending: applied" in migrated.stdout and "reminders/0001_reminders.sql" in migrated.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        add_book(conn, "b1", "Dune")
        message = message_for("lending.lend_book", LendBook("b1", "ann"))
    runtime = Runtime(Settings(database_url=dsn))
    try:
        assert deliver(lending_example.lend_book, runtime, message) is Outcome.OK
    finally:
        runtime.close()
    shown = estafeta(dsn, "events", "show", "book-b1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"]["borrower"] == "ann"
    projected = estafeta(dsn, "projections", "rebuild", "books_on_loan")
    assert projected.returncode == 0 and "rebuilt from 1 events" in projected.stdout, projected.stderr
    status = json.loads(estafeta(dsn, "projections", "status", "--json").stdout)
    [books] = status["projections"]
    assert (books["name"], books["lag_events"]) == ("books_on_loan", 0)


@pytest.mark.heavy
@pytest.mark.integration
def test_the_readme_commands_run_it_on_rabbitmq_through_a_worker_killed_midway(
    dsn: str, amqp_url: str, tmp_path
) -> None:
    """``dramatiq examples.lending`` and ``estafeta relay``: two members race for each of ten books, and a SIGKILL."""
    env = {**service_env(dsn, amqp_url), "ESTAFETA_APP": "examples.lending"}
    assert processes.estafeta(env, "migrate").returncode == 0
    books = [f"b{i}" for i in range(10)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            for book in books:
                add_book(conn, book, f"Volume {book}")
                lending.send(conn, LendBook(book, f"ann-{book}"))
                lending.send(conn, LendBook(book, f"bob-{book}"))
        workers = processes.workers(env, tmp_path, processes=2, module="examples.lending")
        relay = processes.relay(env, tmp_path)
        with processes.running(workers, relay):
            wait_until(lambda: scalar(conn, "SELECT count(*) FROM lending.inbox") >= 4, timeout=60, what="a few loans")
            workers.kill()  # SIGKILL, in the middle of the rest
            again = processes.workers(env, tmp_path, processes=2, module="examples.lending")
            with processes.running(again):
                wait_until(
                    lambda: scalar(conn, "SELECT count(*) FROM lending.inbox") == 20, timeout=120, what="every loan"
                )
                wait_until(
                    lambda: scalar(conn, "SELECT count(*) FROM reminders.inbox") == 10, timeout=60, what="reminders"
                )
                # The workers run the projection too (docs: "Projectors also run in every dramatiq worker").
                wait_until(lambda: len(_on_loan(conn)) == 10, timeout=60, what="books_on_loan")
        lent = dict(
            conn.execute("SELECT stream_id, data->>'member' FROM lending.events WHERE type = 'BookLent'").fetchall()
        )
        assert scalar(conn, "SELECT count(*) FROM lending.events WHERE type = 'BookLent'") == 10  # one per book
        assert _on_loan(conn) == {book_id(stream): member for stream, member in lent.items()}
        reminded = dict(conn.execute("SELECT book_id, member FROM reminders.reminders WHERE loan = 1").fetchall())
        assert reminded == _on_loan(conn)
        # The ten losers were refused, each parked once with its reason (no saga waits for an answer).
        reasons = [r[0] for r in conn.execute("SELECT reason FROM lending.dead_letters").fetchall()]
        assert len(reasons) == 10 and all("is on loan to" in reason for reason in reasons), reasons


def test_the_docs_quote_the_example_as_it_is() -> None:
    """Each Python block of the worked example's page is a verbatim piece of the example or of this file.

    Docstrings aside: the page quotes the code without them.
    """
    page = (ROOT / "docs" / "how-to" / "event-sourced-service.md").read_text()
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", page, re.DOTALL)
    assert len(blocks) >= 4
    quoted = [
        without_docstrings(Path(lending_example.__file__).read_text()),
        without_docstrings(Path(__file__).read_text()),
    ]
    for block in blocks:
        assert any(block in source for source in quoted), f"the page's block is in neither file:\n{block}"
