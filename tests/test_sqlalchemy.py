"""estafeta on SQLAlchemy 2.x sessions (sync): the ORM's writes and estafeta's rows in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

from estafeta import HttpResponse, IdempotentRequest, Runtime
from estafeta import sqlalchemy as es
from estafeta_sql import inbox
from examples.shelf import Item, ItemAdded, Restock, Stocking, idempotency, shelf, stocking, store

from .helpers import message_for, scalar, wait_until


def engine_url(dsn: str, driver: str = "psycopg") -> sqlalchemy.URL:
    """The SQLAlchemy URL of a libpq DSN, with ``driver``."""
    params = sqlalchemy.engine.make_url("postgresql://").set(drivername=f"postgresql+{driver}")
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    return params.set(
        host=str(parts.get("host")),
        port=int(str(parts.get("port", 5432))),
        username=str(parts.get("user")),
        database=str(parts.get("dbname")),
    )


@pytest.fixture
def engine(database_url: str, runtime: Runtime) -> Iterator[Engine]:
    """An engine on the run's (emptied) database, with the psycopg driver."""
    made = create_engine(engine_url(database_url))
    yield made
    made.dispose()


def counts(conn: Any) -> tuple[int, int, int, int]:
    """Items, outbox rows, stocking sagas and events of the shelf."""
    return (
        scalar(conn, "SELECT count(*) FROM shelf.items"),
        scalar(conn, "SELECT count(*) FROM shelf.outbox"),
        scalar(conn, "SELECT count(*) FROM shelf.saga_stocking"),
        scalar(conn, "SELECT count(*) FROM shelf.events"),
    )


def write_everything(session: Session, item_id: uuid.UUID) -> None:
    """An ORM write, then every producer operation, in the session's transaction."""
    session.add(Item(item_id=item_id, name=f"item {item_id}", quantity=0))
    session.flush()
    es.send(session, shelf, Restock(item_id, 1))
    es.publish(session, shelf, ItemAdded(item_id, "x"))
    es.start_saga(session, stocking, Stocking(item_id, 2))
    es.append_events(session, store, f"item-{item_id}", [ItemAdded(item_id, "x")])


def test_the_orm_write_and_every_producer_row_commit_together(engine: Engine, conn) -> None:
    with Session(engine) as session, session.begin():
        write_everything(session, uuid.uuid4())
    # The item; send, publish and the saga's first command; the saga; the event.
    assert counts(conn) == (1, 3, 1, 1)


def test_an_exception_inside_the_block_rolls_back_the_orm_write_and_every_producer_row(engine: Engine, conn) -> None:
    with pytest.raises(RuntimeError, match="after the writes"), Session(engine) as session, session.begin():
        write_everything(session, uuid.uuid4())
        raise RuntimeError("after the writes")
    assert counts(conn) == (0, 0, 0, 0)


def test_a_rollback_of_the_session_takes_the_outbox_rows_with_it(engine: Engine, conn) -> None:
    with Session(engine) as session:
        write_everything(session, uuid.uuid4())
        session.rollback()
        session.add(Item(item_id=uuid.uuid4(), name="kept", quantity=0))
        session.commit()
    assert counts(conn) == (1, 0, 0, 0)


def test_a_core_connection_joins_its_begun_transaction(engine: Engine, conn) -> None:
    with engine.connect() as connection:
        with connection.begin():
            es.send(connection, shelf, Restock(uuid.uuid4(), 1))
        with pytest.raises(ZeroDivisionError), connection.begin():
            es.send(connection, shelf, Restock(uuid.uuid4(), 1))
            _ = 1 / 0
    assert counts(conn)[1] == 1


def test_a_sent_command_reaches_the_broker_through_the_relay_and_its_step_uses_the_orm(
    engine: Engine, conn, stub_broker, stub_worker, running_relay
) -> None:
    item_id = uuid.uuid4()
    with Session(engine) as session, session.begin():
        session.add(Item(item_id=item_id, name="bolts", quantity=0))
        session.flush()
        es.send(session, shelf, Restock(item_id, 5))
    wait_until(lambda: scalar(conn, "SELECT quantity FROM shelf.items") == 5, what="the restock step")
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM shelf.outbox") == 0, what="the relay")
    assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 1


def test_a_saga_started_on_a_session_completes(engine: Engine, conn, stub_broker, stub_worker, running_relay) -> None:
    item_id = uuid.uuid4()
    with Session(engine) as session, session.begin():
        session.add(Item(item_id=item_id, name="nuts", quantity=1))
        session.flush()
        saga_id = es.start_saga(session, stocking, Stocking(item_id, 2))
    wait_until(
        lambda: scalar(conn, "SELECT status FROM shelf.saga_stocking WHERE saga_id = %s", saga_id) == "completed",
        what="the saga",
    )
    assert scalar(conn, "SELECT quantity FROM shelf.items") == 3


def test_a_savepoint_rolled_back_takes_only_its_own_outbox_row(engine: Engine, conn) -> None:
    with Session(engine) as session, session.begin():
        session.add(Item(item_id=uuid.uuid4(), name="kept", quantity=0))
        es.send(session, shelf, Restock(uuid.uuid4(), 1))
        nested = session.begin_nested()
        es.send(session, shelf, Restock(uuid.uuid4(), 2))
        nested.rollback()
        with session.begin_nested():
            es.send(session, shelf, Restock(uuid.uuid4(), 3))
    sent = conn.execute("SELECT message->'args'->0->>'quantity' FROM shelf.outbox ORDER BY id")
    quantities = [row[0] for row in sent]
    assert quantities == ["1", "3"]
    assert counts(conn)[0] == 1


def test_a_connection_with_no_transaction_is_refused_clearly(engine: Engine, conn) -> None:
    with engine.connect() as connection, pytest.raises(es.NoTransaction, match=r"conn\.begin\(\)"):
        es.send(connection, shelf, Restock(uuid.uuid4(), 1))
    with Session(engine, autobegin=False) as session, pytest.raises(es.NoTransaction, match="no transaction"):
        es.send(session, shelf, Restock(uuid.uuid4(), 1))
    assert counts(conn)[1] == 0


def test_an_autocommit_engine_is_refused_clearly(engine: Engine, conn) -> None:
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with Session(autocommit) as session, pytest.raises(es.NoTransaction, match="AUTOCOMMIT"):
        es.send(session, shelf, Restock(uuid.uuid4(), 1))
    assert counts(conn)[1] == 0


def test_another_driver_is_refused_clearly(tmp_path) -> None:
    other = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with Session(other) as session, pytest.raises(es.UnsupportedDriver, match=r"sqlite\+pysqlite.*postgresql\+psycopg"):
        es.send(session, shelf, Restock(uuid.uuid4(), 1))
    # SQLAlchemy's own error type: code that catches it catches this.
    assert issubclass(es.UnsupportedDriver, sqlalchemy.exc.InvalidRequestError)


def request(key: str | None, body: bytes = b'{"name": "washers"}') -> IdempotentRequest:
    return IdempotentRequest("client-1", key, "POST", "/items", body, "application/json")


def test_the_idempotency_record_commits_with_the_orm_write_and_a_repeat_is_replayed(engine: Engine, conn) -> None:
    calls = []

    def place(session: Session) -> HttpResponse:
        calls.append(1)
        item_id = uuid.uuid4()
        session.add(Item(item_id=item_id, name="washers", quantity=0))
        session.flush()
        es.send(session, shelf, Restock(item_id, 1))
        return HttpResponse(201, (("Location", f"/items/{item_id}"),), b"{}")

    with Session(engine) as session:
        first = es.run_idempotent(session, idempotency, request("k1"), place)
    with Session(engine) as session:
        again = es.run_idempotent(session, idempotency, request("k1"), place)
    assert (first.status, first.replayed, again.status, again.replayed) == (201, False, 201, True)
    assert again.headers == first.headers
    assert len(calls) == 1
    assert counts(conn)[:2] == (1, 1)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 1


def test_a_failure_after_the_orm_write_leaves_no_row_and_no_record(engine: Engine, conn) -> None:
    def place(session: Session) -> HttpResponse:
        session.add(Item(item_id=uuid.uuid4(), name="washers", quantity=0))
        session.flush()
        es.send(session, shelf, Restock(uuid.uuid4(), 1))
        raise RuntimeError("the payment service is down")

    with Session(engine) as session, pytest.raises(RuntimeError, match="payment service"):
        es.run_idempotent(session, idempotency, request("k2"), place)
    assert counts(conn)[:2] == (0, 0)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 0


def test_a_refusal_keeps_none_of_the_handlers_writes_and_is_replayed(engine: Engine, conn) -> None:
    def refuse(session: Session) -> HttpResponse:
        session.add(Item(item_id=uuid.uuid4(), name="washers", quantity=0))
        session.flush()
        return HttpResponse(409, (), b"out of stock")

    with Session(engine) as session:
        first = es.run_idempotent(session, idempotency, request("k3"), refuse)
        again = es.run_idempotent(session, idempotency, request("k3"), refuse)
    assert (first.status, again.status, again.replayed, again.body) == (409, 409, True, b"out of stock")
    assert counts(conn)[0] == 0


def test_run_idempotent_refuses_a_session_already_in_a_transaction(engine: Engine) -> None:
    refused = pytest.raises(sqlalchemy.exc.InvalidRequestError, match="its own transactions")
    with Session(engine) as session, session.begin(), refused:
        es.run_idempotent(session, idempotency, request("k4"), lambda s: HttpResponse(200, (), b""))


# -- the ORM inside a step -----------------------------------------------------------------------------


def add_item(engine: Engine, quantity: int = 0) -> uuid.UUID:
    item_id = uuid.uuid4()
    with Session(engine) as session, session.begin():
        session.add(Item(item_id=item_id, name=f"item {item_id}", quantity=quantity))
    return item_id


def test_a_steps_orm_change_commits_once_and_a_duplicate_delivery_changes_nothing(
    engine: Engine, runtime: Runtime, conn
) -> None:
    from estafeta import deliver
    from examples.shelf import restock

    item_id = add_item(engine)
    message = message_for("shelf.restock", Restock(item_id, 4))
    assert deliver(restock, runtime, message) == "ok"
    assert deliver(restock, runtime, message) == "duplicate"
    assert scalar(conn, "SELECT quantity FROM shelf.items") == 4


def test_a_step_failing_after_its_orm_change_keeps_neither_the_change_nor_the_inbox_row(
    engine: Engine, runtime: Runtime, conn
) -> None:
    from estafeta import deliver
    from examples.shelf import restock

    item_id = add_item(engine, quantity=1)
    # The flush at the step's end breaks the CHECK (quantity >= 0): the step's transaction rolls back whole.
    message = message_for("shelf.restock", Restock(item_id, -5))
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        deliver(restock, runtime, message)
    assert scalar(conn, "SELECT quantity FROM shelf.items") == 1
    assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 0
    assert inbox.list_dead_letters(conn, "shelf") == []
    # The step's connection went back to the pool clean: the next delivery works.
    assert deliver(restock, runtime, message_for("shelf.restock", Restock(item_id, 2))) == "ok"
    assert scalar(conn, "SELECT quantity FROM shelf.items") == 3


def test_counting_items_through_the_steps_session_sees_the_steps_own_writes(engine: Engine, runtime: Runtime) -> None:
    # The session is on the step's transaction: what the step wrote through ctx.conn is visible to the ORM.
    from estafeta import StepContext
    from estafeta.sqlalchemy import session as step_session

    seen: list[int] = []

    @shelf.step(Stocking, name="test_count_items")
    def count(ctx: StepContext, command: Stocking) -> None:
        ctx.conn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, 'raw')", (command.item_id,))
        seen.append(step_session(ctx).scalar(select(func.count()).select_from(Item)) or 0)

    try:
        from estafeta import deliver

        assert deliver(count, runtime, message_for("shelf.test_count_items", Stocking(uuid.uuid4(), 1))) == "ok"
    finally:
        shelf._steps.pop("shelf.test_count_items")
    assert seen == [1]


def test_a_steps_session_rolled_back_fails_the_step_whole(engine: Engine, runtime: Runtime, conn) -> None:
    from estafeta import StepContext, deliver
    from estafeta.sqlalchemy import session as step_session

    @shelf.step(Stocking, name="test_roll_back")
    def roll_back(ctx: StepContext, command: Stocking) -> None:
        session = step_session(ctx)
        session.add(Item(item_id=command.item_id, name="rolled back", quantity=0))
        session.flush()
        session.rollback()
        session.add(Item(item_id=uuid.uuid4(), name="after the rollback", quantity=0))

    try:
        with pytest.raises(es.SessionRolledBack):
            deliver(roll_back, runtime, message_for("shelf.test_roll_back", Stocking(uuid.uuid4(), 1)))
    finally:
        shelf._steps.pop("shelf.test_roll_back")
    assert scalar(conn, "SELECT count(*) FROM shelf.items") == 0
    assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 0


def test_sessions_of_many_steps_leave_one_notice_handler_on_the_pooled_connection(
    engine: Engine, database_url: str
) -> None:
    from estafeta import Settings, deliver
    from examples.shelf import restock

    item_id = add_item(engine)
    one = Runtime(Settings(database_url=database_url, pool_size=1))  # every delivery on the same connection
    try:
        for _ in range(3):
            assert deliver(restock, one, message_for("shelf.restock", Restock(item_id, 1))) == "ok"
        with one.database("shelf").connection() as pooled:
            handlers = list(pooled._notice_handlers)  # SQLAlchemy adds its logger at every connect
    finally:
        one.close()
    assert len(handlers) == len(set(handlers)) >= 1


def test_a_steps_session_commit_only_flushes_and_a_later_failure_rolls_it_back(
    engine: Engine, runtime: Runtime, conn
) -> None:
    from estafeta import StepContext, deliver
    from estafeta.sqlalchemy import session as step_session

    @shelf.step(Stocking, name="test_commit_then_fail")
    def commit_then_fail(ctx: StepContext, command: Stocking) -> None:
        session = step_session(ctx)
        session.add(Item(item_id=command.item_id, name="committed early?", quantity=0))
        session.commit()
        ctx.send(Restock(command.item_id, 1))
        raise RuntimeError("after the commit")

    try:
        with pytest.raises(RuntimeError, match="after the commit"):
            deliver(commit_then_fail, runtime, message_for("shelf.test_commit_then_fail", Stocking(uuid.uuid4(), 1)))
    finally:
        shelf._steps.pop("shelf.test_commit_then_fail")
    assert counts(conn)[:2] == (0, 0)
    assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 0
