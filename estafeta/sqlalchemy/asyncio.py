"""estafeta on SQLAlchemy's asyncio extension: ``AsyncSession`` and ``AsyncConnection`` (``postgresql+psycopg://``).

::

    from estafeta.sqlalchemy import asyncio as es

    async with AsyncSession(engine) as session, session.begin():
        session.add(Order(id=order_id, total=42))
        await es.send(session, orders, ChargePayment(order_id))

The same operations as :mod:`estafeta.sqlalchemy`, awaited: they write through the
session's psycopg ``AsyncConnection`` inside its transaction (``estafeta.aio``'s runner,
the synchronous API's SQL), and never block the event loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy.exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from estafeta.events.store import ANY, EventMetadata, EventStore, ExpectedVersion, RecordedEvent
from estafeta.idempotency.keys import Idempotency, IdempotentRequest, Step
from estafeta.idempotency.problem import HttpResponse
from estafeta_sql import plan

from .. import aio
from . import NoTransaction, checked

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga

__all__ = ["AsyncSessionHandler", "append_events", "connection", "publish", "run_idempotent", "send", "start_saga"]

#: A handler for :func:`run_idempotent`: given the session in the record's transaction, do the work and answer.
AsyncSessionHandler = Callable[[AsyncSession], Awaitable[HttpResponse]]


async def connection(bind: AsyncSession | AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` under ``bind``'s current transaction (an ``AsyncSession`` begins one).

    Raises :class:`estafeta.sqlalchemy.UnsupportedDriver` unless the engine uses psycopg,
    and :class:`estafeta.sqlalchemy.NoTransaction` for an ``AsyncConnection`` with no
    transaction begun or an engine in ``AUTOCOMMIT``.
    """
    if isinstance(bind, AsyncSession):
        try:
            sa_connection = await bind.connection()
        except sqlalchemy.exc.InvalidRequestError as exc:
            raise NoTransaction(f"the session has no transaction: {exc}") from None
    elif isinstance(bind, AsyncConnection):
        sa_connection = bind
    else:
        raise TypeError(f"expected a SQLAlchemy AsyncSession or AsyncConnection, got {type(bind).__name__}")
    raw = await sa_connection.get_raw_connection()
    return checked(sa_connection, raw.driver_connection, psycopg.AsyncConnection)  # type: ignore[no-any-return]


async def send(bind: AsyncSession | AsyncConnection, service: Service, command: Any, **options: Any) -> uuid.UUID:
    """:meth:`Service.send <estafeta.Service.send>` in ``bind``'s transaction; return the message id."""
    return await aio.send(await connection(bind), service, command, **options)


async def publish(
    bind: AsyncSession | AsyncConnection, service: Service, event: Any, **options: Any
) -> list[uuid.UUID]:
    """:meth:`Service.publish <estafeta.Service.publish>` in ``bind``'s transaction; return the message ids."""
    return await aio.publish(await connection(bind), service, event, **options)


async def start_saga(bind: AsyncSession | AsyncConnection, saga: Saga, data: Any, **options: Any) -> uuid.UUID:
    """:meth:`Saga.start <estafeta.Saga.start>` in ``bind``'s transaction (see :func:`estafeta.aio.start_saga`)."""
    return await aio.start_saga(await connection(bind), saga, data, **options)


async def append_events(
    bind: AsyncSession | AsyncConnection,
    store: EventStore,
    stream_id: str,
    events: Sequence[Any],
    *,
    expected_version: ExpectedVersion = ANY,
    stream_type: str | None = None,
    metadata: EventMetadata | None = None,
) -> list[RecordedEvent[Any]]:
    """:meth:`EventStore.append <estafeta.EventStore.append>` in ``bind``'s transaction."""
    return await aio.append_events(
        await connection(bind),
        store,
        stream_id,
        events,
        expected_version=expected_version,
        stream_type=stream_type,
        metadata=metadata,
    )


async def run_idempotent(
    session: AsyncSession, idempotency: Idempotency, request: IdempotentRequest, handler: AsyncSessionHandler
) -> HttpResponse:
    """:func:`estafeta.sqlalchemy.run_idempotent` on an ``AsyncSession``: ``await handler(session)`` with the record."""
    if session.in_transaction():
        raise sqlalchemy.exc.InvalidRequestError(
            "run_idempotent begins and ends its own transactions: pass a session with none open"
        )

    async def perform(op: Any) -> Any:
        if isinstance(op, plan.Statement):
            return await plan.execute_async(await connection(session), op)
        if isinstance(op, plan.SyncOnly):
            raise plan.NeedsSyncConnection(f"{op.what} runs only on a synchronous connection")
        if op is Step.HANDLE:
            return await handler(session)
        if op is Step.BEGIN:
            await session.begin()
        elif op is Step.COMMIT:
            await session.commit()
        else:
            await session.rollback()
        return None

    return await plan.drive_async(idempotency.plan_for(request), perform)
