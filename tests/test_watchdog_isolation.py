"""The watchdog tells one saga's error from an outage: the first is recorded on that saga, the second pauses it.

A saga's own database error (its ``on_transition`` hook failing, bad data) is recorded on
its row and the other sagas are moved on; a participant's database that is unreachable
delays only the sagas that need it; and an error is never recorded on a saga that has
moved on since it was diagnosed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest

from estafeta import (
    App,
    DatabaseError,
    DatabaseUnavailable,
    Reply,
    Runtime,
    Saga,
    SagaStep,
    SagaTransition,
    Service,
    Settings,
    StepContext,
    Watchdog,
    deliver,
)
from estafeta.sagas.watchdog import WATCHDOG_ERRORS
from estafeta_sql import sagas
from estafeta_sql.errors import StatementFailed
from estafeta_sql.pool import Database, connect

from .conftest import TEST_SETTINGS
from .helpers import message_for, scalar, wait_until

OWNER = Service("wdiso")
NEAR = Service("wdnear")
FAR = Service("wdfar")  # its database is unreachable in the tests that use it


@attrs.frozen
class Item:
    """The data of every saga of this module."""

    item_id: uuid.UUID
    #: A statement the saga's ``on_transition`` hook runs on every transition but its start.
    poison: str = ""


@attrs.frozen
class Near:
    item_id: uuid.UUID
    undo: bool = False


@attrs.frozen
class Far:
    item_id: uuid.UUID
    undo: bool = False


@attrs.frozen
class Both:
    """Two steps handle it: a saga waiting on it cannot be sent again (the watchdog's diagnosis)."""

    item_id: uuid.UUID
    undo: bool = False


@NEAR.step(Near, name="near")
def near(ctx: StepContext, command: Near) -> None:
    return None


@NEAR.step(Both, name="both_a")
def both_a(ctx: StepContext, command: Both) -> None:
    return None


@NEAR.step(Both, name="both_b")
def both_b(ctx: StepContext, command: Both) -> None:
    return None


@FAR.step(Far, name="far")
def far(ctx: StepContext, command: Far) -> None:
    return None


def _step(name: str, command: type, **options: Any) -> SagaStep:
    return SagaStep(
        name,
        action=lambda s: command(s.data.item_id),
        compensation=lambda s: command(s.data.item_id, undo=True),
        **options,
    )


def poisoned(conn: psycopg.Connection[Any], transition: SagaTransition) -> None:
    if transition.data is not None and transition.data.poison and transition.event != "started":
        conn.execute(transition.data.poison)


#: Set by the race test: a reply's transition then waits in the hook, holding the saga's lock.
IN_REPLY = threading.Event()
PROCEED = threading.Event()
HOLD_REPLIES = threading.Event()


def holding(conn: psycopg.Connection[Any], transition: SagaTransition) -> None:
    if transition.reply is not None and HOLD_REPLIES.is_set():
        IN_REPLY.set()
        assert PROCEED.wait(10), "the test never let the reply go on"


NEARBY = Saga("nearby", service=OWNER, data=Item, key="item_id", steps=[_step("near", Near)], on_transition=poisoned)
#: Out of attempts at its first deadline: the watchdog reads why the participant parked it.
FARAWAY = Saga("faraway", service=OWNER, data=Item, key="item_id", steps=[_step("far", Far, max_attempts=1)])
RACE = Saga(
    "race",
    service=OWNER,
    data=Item,
    key="item_id",
    steps=[_step("first", Near), _step("second", Both), _step("third", Near)],
    on_transition=holding,
)
APP = App("wdiso", services=[OWNER, NEAR, FAR])


@pytest.fixture(scope="module")
def migrated(database_url: str) -> str:
    runtime = Runtime(Settings(database_url=database_url))
    runtime.migrate([OWNER, NEAR])
    runtime.close()
    return database_url


@pytest.fixture
def owner(migrated: str, conn: psycopg.Connection[Any]) -> Iterator[Runtime]:
    """A runtime on the run's database, this module's sagas and outboxes emptied first."""
    for saga in (NEARBY, FARAWAY, RACE):
        conn.execute(f"TRUNCATE wdiso.{saga.table.table}, wdiso.{saga.table.log}")
    conn.execute("TRUNCATE wdiso.outbox, wdnear.dead_letters")
    runtime = Runtime(
        Settings(
            database_url=migrated,
            # Nothing listens there: the participant's database is down.
            service_database_urls={"wdfar": "postgresql://postgres@127.0.0.1:1/wdfar"},
            **TEST_SETTINGS,  # type: ignore[arg-type]
        )
    )
    yield runtime
    runtime.close()


def start(
    runtime: Runtime, saga: Saga, conn: psycopg.Connection[Any], *, overdue_by: int, poison: str = ""
) -> uuid.UUID:
    """Start a saga (a 60 s step timeout) and put its deadline ``overdue_by`` seconds in the past."""
    with runtime.database("wdiso").transaction() as tx:
        saga_id = saga.start(tx, Item(uuid.uuid4(), poison), step_timeout=60)
    overdue(conn, saga, saga_id, overdue_by)
    return saga_id


def overdue(conn: psycopg.Connection[Any], saga: Saga, saga_id: uuid.UUID, seconds: int) -> None:
    conn.execute(
        f"UPDATE wdiso.{saga.table.table} SET deadline_at = now() - make_interval(secs => %s) WHERE saga_id = %s",
        (seconds, saga_id),
    )


def row(conn: psycopg.Connection[Any], saga: Saga, saga_id: uuid.UUID) -> sagas.SagaRow:
    found = sagas.get(conn, saga.table, saga_id)
    assert found is not None
    return found


# -- where the driver's error is translated --------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 1/0",
        "DO $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$",
        "SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)",
        "SELECT * FROM no_such_table",
    ],
    ids=["data error", "raised", "statement timeout", "undefined table"],
)
def test_an_error_of_one_statement_is_not_an_outage(migrated: str, statement: str) -> None:
    database = Database(migrated)
    try:
        with pytest.raises(StatementFailed) as raised, database.transaction() as tx:
            tx.execute(statement)
        assert isinstance(raised.value, DatabaseError) and not isinstance(raised.value, DatabaseUnavailable)
        with database.transaction() as tx:  # the database is still there for the next operation
            assert scalar(tx, "SELECT 1") == 1
    finally:
        database.close()


def test_a_lost_or_refused_connection_is_an_outage(migrated: str) -> None:
    database = Database(migrated)
    try:
        with pytest.raises(DatabaseUnavailable), database.transaction() as tx:
            tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # the server ends the session
    finally:
        database.close()
    with pytest.raises(DatabaseUnavailable):
        connect("postgresql://postgres@127.0.0.1:1/nothing_listens")


# -- the watchdog -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "poison",
    ["SELECT 1/0", "DO $$ BEGIN RAISE EXCEPTION 'no more orders today'; END $$"],
    ids=["data error", "raised by the hook"],
)
def test_a_database_error_of_one_saga_is_recorded_on_it_and_the_others_move_on(
    owner: Runtime, conn: psycopg.Connection[Any], poison: str
) -> None:
    bad = start(owner, NEARBY, conn, overdue_by=60, poison=poison)  # the most overdue: met first
    good = start(owner, NEARBY, conn, overdue_by=10)
    watchdog = Watchdog(owner, [NEARBY])
    errors = WATCHDOG_ERRORS.labels("nearby")._value.get()
    assert watchdog.check_once() == {"error": 1, "resent": 1}
    assert row(conn, NEARBY, good).attempts == 2
    first = row(conn, NEARBY, bad)
    assert (first.status, first.attempts) == ("running", 1)
    assert first.last_error is not None and first.last_error.startswith("watchdog: StatementFailed: ")
    assert first.deadline_at is not None and first.deadline_at > first.updated_at  # looked at again later
    # Each later deadline meets the same error; the third in a row fails the saga for an operator.
    for outcome in ("error", "failed"):
        overdue(conn, NEARBY, bad, 60)
        assert watchdog.check_once() == {outcome: 1}
    failed = row(conn, NEARBY, bad)
    assert failed.status == "failed" and failed.deadline_at is None
    assert failed.last_error is not None and failed.last_error.endswith("(3 errors in a row)")
    events = [e.event for e in sagas.timeline(conn, NEARBY.table, bad)]
    assert events == ["started", "error", "error", "error", "failed"]
    assert WATCHDOG_ERRORS.labels("nearby")._value.get() == errors + 3


def test_an_error_in_a_row_restarts_after_the_saga_moved_on(owner: Runtime, conn: psycopg.Connection[Any]) -> None:
    saga_id = start(owner, NEARBY, conn, overdue_by=60, poison="SELECT 1/0")
    watchdog = Watchdog(owner, [NEARBY])
    for _ in range(2):
        assert watchdog.check_once() == {"error": 1}
        overdue(conn, NEARBY, saga_id, 60)
    conn.execute("UPDATE wdiso.saga_nearby SET payload = payload - 'poison' WHERE saga_id = %s", (saga_id,))
    assert watchdog.check_once() == {"resent": 1}  # the cause was fixed: it goes on, and the count restarts
    conn.execute('UPDATE wdiso.saga_nearby SET payload = payload || \'{"poison": "SELECT 1/0"}\'')
    overdue(conn, NEARBY, saga_id, 60)
    assert watchdog.check_once() == {"error": 1}
    assert row(conn, NEARBY, saga_id).status == "running"


def test_an_unreachable_participant_delays_only_the_sagas_that_need_it(
    owner: Runtime, conn: psycopg.Connection[Any]
) -> None:
    stranded = [start(owner, FARAWAY, conn, overdue_by=60 + i) for i in range(2)]
    healthy = start(owner, NEARBY, conn, overdue_by=10)
    before = {saga_id: row(conn, FARAWAY, saga_id) for saga_id in stranded}
    # Out of attempts, the stranded sagas need their participant's dead letters: they wait
    # (its database is tried once per pass), and nothing is recorded on them: not their fault.
    assert Watchdog(owner, [FARAWAY, NEARBY]).check_once() == {"waiting": 2, "resent": 1}
    assert row(conn, NEARBY, healthy).attempts == 2
    assert {saga_id: row(conn, FARAWAY, saga_id) for saga_id in stranded} == before


def test_the_watchdog_never_fails_a_saga_that_has_moved_on_since_its_diagnosis(
    owner: Runtime, conn: psycopg.Connection[Any]
) -> None:
    saga_id = start(owner, RACE, conn, overdue_by=60)
    # The saga waits on `second`, whose command two steps handle: the watchdog, reading the
    # row, concludes it cannot be sent again and fails it...
    conn.execute("UPDATE wdiso.saga_race SET current_step = 'second' WHERE saga_id = %s", (saga_id,))
    context = {"saga": "race", "saga_id": str(saga_id), "step": "second", "version": 1, "direction": "action"}
    answer = message_for(RACE.reply_actor, Reply(in_reply_to=str(uuid.uuid4()), ok=True, context=context))
    # ...while the participant's answer to `second` moves it on to `third`, holding its lock
    # until the watchdog waits for that lock.
    HOLD_REPLIES.set()
    IN_REPLY.clear()
    PROCEED.clear()
    outcomes: dict[str, Any] = {}
    reply = threading.Thread(target=lambda: outcomes.update(reply=deliver(RACE.reply_step, owner, answer)))
    watch = threading.Thread(target=lambda: outcomes.update(watch=Watchdog(owner, [RACE]).check_once()))
    try:
        reply.start()
        assert IN_REPLY.wait(10), "the reply never reached its transition"
        watch.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        wait_until(lambda: scalar(conn, waiting) >= 1, timeout=10, what="the watchdog waiting for the saga's lock")
    finally:
        PROCEED.set()
        HOLD_REPLIES.clear()
        reply.join(10)
        watch.join(10)
    moved = row(conn, RACE, saga_id)
    assert (moved.status, moved.current_step, moved.version) == ("running", "third", 2)
    assert moved.last_error is None
    assert "failed" not in outcomes["watch"]
    assert [e.event for e in sagas.timeline(conn, RACE.table, saga_id)] == ["started", "advanced"]
