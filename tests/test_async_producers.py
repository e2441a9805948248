"""The producer side from async code: ``estafeta.aio`` on psycopg's AsyncConnection, and SQLAlchemy's AsyncSession."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from estafeta import ConcurrencyConflict, HttpResponse, IdempotentRequest, Runtime, aio
from estafeta import NoTransaction as EstafetaNoTransaction
from estafeta.sqlalchemy import NoTransaction, UnsupportedDriver
from estafeta.sqlalchemy import asyncio as es
from estafeta_sql.plan import run_async
from examples.shelf import Item, ItemAdded, Restock, Stocking, idempotency, shelf, stocking, store

from .helpers import scalar, wait_until
from .test_sqlalchemy import counts, engine_url

T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh event loop (one per test)."""

    async def main() -> T:
        return await make()

    return asyncio.run(main())


@pytest.fixture
def async_engine_url(database_url: str, runtime: Runtime) -> sqlalchemy.URL:
    """The run's (emptied) database as an async engine URL, psycopg driver."""
    return engine_url(database_url)


def with_engine(url: sqlalchemy.URL, work: Callable[[AsyncEngine], Awaitable[T]], **options: Any) -> T:
    """Run ``work(engine)`` on an async engine made (and disposed of) on the test's event loop."""

    async def main() -> T:
        engine = create_async_engine(url, **options)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


# -- estafeta.aio on a psycopg AsyncConnection ------------------------------------------------------


async def write_everything(conn: psycopg.AsyncConnection[Any], item_id: uuid.UUID) -> None:
    await conn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, %s)", (item_id, f"item {item_id}"))
    await aio.send(conn, shelf, Restock(item_id, 1))
    await aio.publish(conn, shelf, ItemAdded(item_id, "x"))
    await aio.start_saga(conn, stocking, Stocking(item_id, 2))
    await aio.append_events(conn, store, f"item-{item_id}", [ItemAdded(item_id, "x")])


def test_aio_writes_commit_with_the_callers_transaction(database_url: str, runtime: Runtime, conn) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn, aconn.transaction():
            await write_everything(aconn, uuid.uuid4())

    run(main)
    assert counts(conn) == (1, 3, 1, 1)


def test_aio_writes_roll_back_with_the_callers_transaction(database_url: str, runtime: Runtime, conn) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn, aconn.transaction():
            await write_everything(aconn, uuid.uuid4())
            raise RuntimeError("after the writes")

    with pytest.raises(RuntimeError, match="after the writes"):
        run(main)
    assert counts(conn) == (0, 0, 0, 0)


def test_aio_producers_refuse_an_autocommit_connection_with_no_transaction_open(
    database_url: str, runtime: Runtime, conn
) -> None:
    item_id = uuid.uuid4()
    writes: list[Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]]] = [
        lambda aconn: aio.send(aconn, shelf, Restock(item_id, 1)),
        lambda aconn: aio.publish(aconn, shelf, ItemAdded(item_id, "x")),
        lambda aconn: aio.start_saga(aconn, stocking, Stocking(item_id, 2)),
    ]

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            for write in writes:
                with pytest.raises(EstafetaNoTransaction, match="autocommit with none open"):
                    await write(aconn)
            async with aconn.transaction():  # the same connection, in a transaction: accepted
                for write in writes:
                    await write(aconn)

    run(main)
    assert counts(conn) == (0, 3, 1, 0)


def test_sync_producers_refuse_an_autocommit_connection_with_no_transaction_open(
    database_url: str, runtime: Runtime, conn
) -> None:
    item_id = uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as autocommit:
        for write in (
            lambda: shelf.send(autocommit, Restock(item_id, 1)),
            lambda: shelf.publish(autocommit, ItemAdded(item_id, "x")),
            lambda: stocking.start(autocommit, Stocking(item_id, 2)),
        ):
            with pytest.raises(EstafetaNoTransaction, match="needs a transaction"):
                write()
    assert counts(conn) == (0, 0, 0, 0)


def test_aio_append_reports_a_conflict_as_the_sync_api_does(database_url: str, runtime: Runtime) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            await aio.append_events(aconn, store, "item-1", [ItemAdded(uuid.uuid4(), "a")], expected_version=0)
            with pytest.raises(ConcurrencyConflict, match="already exists at version 1, expected no stream"):
                await aio.append_events(aconn, store, "item-1", [ItemAdded(uuid.uuid4(), "b")], expected_version=0)

    run(main)


def test_a_message_sent_from_async_code_reaches_its_step_through_the_relay(
    database_url: str, runtime: Runtime, conn, stub_broker, stub_worker, running_relay
) -> None:
    item_id = uuid.uuid4()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn, aconn.transaction():
            await aconn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, 'bolts')", (item_id,))
            await aio.send(aconn, shelf, Restock(item_id, 7))

    run(main)
    wait_until(lambda: scalar(conn, "SELECT quantity FROM shelf.items") == 7, what="the restock step")


# -- SQLAlchemy's AsyncSession ----------------------------------------------------------------------


async def session_writes(session: AsyncSession, item_id: uuid.UUID) -> None:
    session.add(Item(item_id=item_id, name=f"item {item_id}", quantity=0))
    await session.flush()
    await es.send(session, shelf, Restock(item_id, 1))
    await es.publish(session, shelf, ItemAdded(item_id, "x"))
    await es.start_saga(session, stocking, Stocking(item_id, 2))
    await es.append_events(session, store, f"item-{item_id}", [ItemAdded(item_id, "x")])


def test_an_async_sessions_writes_and_estafetas_rows_commit_together(async_engine_url, conn) -> None:
    async def work(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session_writes(session, uuid.uuid4())

    with_engine(async_engine_url, work)
    assert counts(conn) == (1, 3, 1, 1)


def test_an_exception_in_an_async_session_rolls_back_both(async_engine_url, conn) -> None:
    async def work(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session_writes(session, uuid.uuid4())
            raise RuntimeError("after the writes")

    with pytest.raises(RuntimeError, match="after the writes"):
        with_engine(async_engine_url, work)
    assert counts(conn) == (0, 0, 0, 0)


def test_an_async_savepoint_rolled_back_takes_its_outbox_row(async_engine_url, conn) -> None:
    async def work(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await es.send(session, shelf, Restock(uuid.uuid4(), 1))
            nested = await session.begin_nested()
            await es.send(session, shelf, Restock(uuid.uuid4(), 2))
            await nested.rollback()

    with_engine(async_engine_url, work)
    assert scalar(conn, "SELECT count(*) FROM shelf.outbox") == 1


def test_async_refusals_are_clear(async_engine_url, conn) -> None:
    async def work(engine: AsyncEngine) -> None:
        async with engine.connect() as connection:
            with pytest.raises(NoTransaction, match="no transaction begun"):
                await es.send(connection, shelf, Restock(uuid.uuid4(), 1))
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        async with AsyncSession(autocommit) as session:
            with pytest.raises(NoTransaction, match="AUTOCOMMIT"):
                await es.send(session, shelf, Restock(uuid.uuid4(), 1))

    with_engine(async_engine_url, work)
    assert scalar(conn, "SELECT count(*) FROM shelf.outbox") == 0


def test_an_async_session_on_another_driver_is_refused(tmp_path) -> None:
    async def work(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session:
            with pytest.raises(UnsupportedDriver, match="postgresql\\+psycopg"):
                await es.send(session, shelf, Restock(uuid.uuid4(), 1))

    with_engine(sqlalchemy.make_url(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"), work)


def test_async_idempotency_on_a_session_replays_and_keeps_one_effect(async_engine_url, conn) -> None:
    calls = []

    async def place(session: AsyncSession) -> HttpResponse:
        calls.append(1)
        item_id = uuid.uuid4()
        session.add(Item(item_id=item_id, name="washers", quantity=0))
        await session.flush()
        await es.send(session, shelf, Restock(item_id, 1))
        return HttpResponse(201, (), str(item_id).encode())

    async def boom(session: AsyncSession) -> HttpResponse:
        session.add(Item(item_id=uuid.uuid4(), name="gaskets", quantity=0))
        await session.flush()
        await es.send(session, shelf, Restock(uuid.uuid4(), 1))
        raise RuntimeError("after the writes")

    request = IdempotentRequest("client-1", "k1", "POST", "/items", b"{}", "application/json")
    other = IdempotentRequest("client-1", "k2", "POST", "/items", b"{}", "application/json")

    async def work(engine: AsyncEngine) -> tuple[HttpResponse, HttpResponse]:
        async with AsyncSession(engine) as session:
            first = await es.run_idempotent(session, idempotency, request, place)
            again = await es.run_idempotent(session, idempotency, request, place)
            with pytest.raises(RuntimeError, match="after the writes"):
                await es.run_idempotent(session, idempotency, other, boom)
        return first, again

    first, again = with_engine(async_engine_url, work)
    assert (first.replayed, again.replayed, again.body) == (False, True, first.body)
    assert len(calls) == 1
    assert counts(conn)[:2] == (1, 1)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 1


def test_many_requests_on_one_loop_go_on_while_one_waits_for_the_database(
    async_engine_url, database_url: str, conn
) -> None:
    # One request's append waits for a stream row the test holds locked. If estafeta's async
    # path made a synchronous database call, that wait would block the loop, and the other
    # requests could never finish while the lock is held: the test would hang (and time out).
    held = "item-held"
    with psycopg.connect(database_url, autocommit=True) as setup:
        store.append(setup, held, [ItemAdded(uuid.uuid4(), "first")])

    async def request(engine: AsyncEngine, stream: str) -> None:
        async with AsyncSession(engine) as session, session.begin():
            item_id = uuid.uuid4()
            session.add(Item(item_id=item_id, name=f"item {item_id}", quantity=0))
            await session.flush()
            await es.append_events(session, store, stream, [ItemAdded(item_id, "x")])
            await es.send(session, shelf, Restock(item_id, 1))

    async def work(engine: AsyncEngine) -> None:
        with psycopg.connect(database_url) as blocker:  # holds the held stream's row until it commits
            store.append(blocker, held, [ItemAdded(uuid.uuid4(), "blocking")])
            waiting = asyncio.create_task(request(engine, held))
            others = [request(engine, f"item-{n}") for n in range(20)]
            await asyncio.wait_for(asyncio.gather(*others), timeout=60)
            assert not waiting.done()
            blocker.commit()
        await asyncio.wait_for(waiting, timeout=60)

    with_engine(async_engine_url, work, pool_size=25)
    assert counts(conn)[:2] == (21, 21)
    assert scalar(conn, "SELECT version FROM shelf.streams WHERE stream_id = %s", held) == 3


def test_a_saga_with_a_sync_hook_is_refused_from_async_code_before_anything_is_written(
    database_url: str, runtime: Runtime, conn
) -> None:
    from estafeta_actors.order_saga import ORDER_SAGA, OrderData

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn, aconn.transaction():
            data = OrderData(uuid.uuid4(), "c1", "s1", 1, 100)
            with pytest.raises(aio.NeedsSyncConnection, match="on_transition hook"):
                await aio.start_saga(aconn, ORDER_SAGA, data)
            # The plan itself refuses the hook's call too, had the check above been skipped.
            with pytest.raises(aio.NeedsSyncConnection, match="on_transition hook of saga order"):
                async with aconn.transaction():  # a savepoint, rolled back with the error
                    await run_async(aconn, ORDER_SAGA.start_plan(data))

    run(main)
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 0
    assert scalar(conn, "SELECT count(*) FROM orders.saga_order") == 0


def test_aio_idempotency_on_an_autocommit_connection_replays_and_keeps_nothing_of_a_failure(
    database_url: str, runtime: Runtime, conn
) -> None:
    calls = []

    async def place(aconn: psycopg.AsyncConnection[Any]) -> HttpResponse:
        calls.append(1)
        item_id = uuid.uuid4()
        await aconn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, 'plain')", (item_id,))
        await aio.send(aconn, shelf, Restock(item_id, 1))
        return HttpResponse(201, (), str(item_id).encode())

    async def boom(aconn: psycopg.AsyncConnection[Any]) -> HttpResponse:
        await aconn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, 'boom')", (uuid.uuid4(),))
        await aio.send(aconn, shelf, Restock(uuid.uuid4(), 1))
        raise RuntimeError("after the writes")

    request = IdempotentRequest("client-1", "k1", "POST", "/items", b"{}", "application/json")

    async def main() -> tuple[HttpResponse, HttpResponse]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            first = await aio.run_idempotent(aconn, idempotency, request, place)
            again = await aio.run_idempotent(aconn, idempotency, request, place)
            with pytest.raises(RuntimeError, match="after the writes"):
                await aio.run_idempotent(aconn, idempotency, IdempotentRequest("client-1", "k2", "POST", "/x"), boom)
        async with await psycopg.AsyncConnection.connect(database_url) as not_autocommit:
            with pytest.raises(ValueError, match="autocommit"):
                await aio.run_idempotent(not_autocommit, idempotency, request, place)
        return first, again

    first, again = run(main)
    assert (first.replayed, again.replayed, again.body) == (False, True, first.body)
    assert len(calls) == 1
    assert counts(conn)[:2] == (1, 1)
