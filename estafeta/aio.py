"""The producer side on psycopg's ``AsyncConnection``: what an async web handler calls, and nothing else.

::

    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute("INSERT INTO orders.orders ...")
        await estafeta.aio.send(conn, orders, ChargePayment(...))

Each function joins ``conn``'s current transaction, as the synchronous API does: the
rows it writes commit or roll back with the caller's. The SQL and every decision are the
synchronous API's own (its plans, ``estafeta_sql.plan``), executed by an asynchronous runner, so
the two cannot drift apart.

Steps stay synchronous Dramatiq actors and there is no async twin of the runtime: Dramatiq
runs an actor on a worker thread, and a step's transaction is a few round trips on a
pooled connection, which an event loop would not make faster, only harder to reason about
(a step blocking the loop would stall every other step of the process).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from estafeta.app.errors import require_transaction
from estafeta.events.store import ANY, EventMetadata, EventStore, ExpectedVersion, RecordedEvent
from estafeta.idempotency.keys import Idempotency, IdempotentRequest, Step, boundary_async
from estafeta.idempotency.problem import HttpResponse
from estafeta.messaging import outbox as outbox
from estafeta_sql import outbox_admin
from estafeta_sql.plan import NeedsSyncConnection, run_async

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga

__all__ = [
    "AsyncHandler",
    "NeedsSyncConnection",
    "append_events",
    "cancel",
    "publish",
    "reschedule",
    "run_idempotent",
    "send",
    "start_saga",
]

#: An async handler for :func:`run_idempotent`: given the transaction's connection, do the work and answer.
AsyncHandler = Callable[[psycopg.AsyncConnection[Any]], Awaitable[HttpResponse]]


async def send(conn: psycopg.AsyncConnection[Any], service: Service, command: Any, **options: Any) -> uuid.UUID:
    """:meth:`Service.send <estafeta.Service.send>` on an async connection: one outbox row in its transaction."""
    require_transaction(conn, "estafeta.aio.send")
    return await run_async(conn, outbox.send_plan(command, service=service.name, router=service.router, **options))


async def publish(conn: psycopg.AsyncConnection[Any], service: Service, event: Any, **options: Any) -> list[uuid.UUID]:
    """:meth:`Service.publish <estafeta.Service.publish>` on an async connection: a row per subscriber."""
    require_transaction(conn, "estafeta.aio.publish")
    return await run_async(conn, outbox.publish_plan(event, service=service.name, router=service.router, **options))


async def cancel(conn: psycopg.AsyncConnection[Any], service: Service, message_id: uuid.UUID) -> None:
    """:meth:`Service.cancel <estafeta.Service.cancel>` on an async connection: the same refusals."""
    await run_async(conn, outbox_admin.cancel_plan(service.name, message_id))


async def reschedule(conn: psycopg.AsyncConnection[Any], service: Service, message_id: uuid.UUID, at: datetime) -> None:
    """:meth:`Service.reschedule <estafeta.Service.reschedule>` on an async connection: the same refusals."""
    await run_async(conn, outbox_admin.reschedule_plan(service.name, message_id, at))


async def start_saga(conn: psycopg.AsyncConnection[Any], saga: Saga, data: Any, **options: Any) -> uuid.UUID:
    """:meth:`Saga.start <estafeta.Saga.start>` on an async connection: the saga's row, its log and first command.

    A saga with an ``on_transition`` hook (which takes a synchronous connection) cannot be
    started here: :class:`NeedsSyncConnection` says so before anything is written. A
    connection with no transaction open is refused (:class:`estafeta.NoTransaction`).
    """
    require_transaction(conn, "estafeta.aio.start_saga")
    if saga.on_transition is not None:
        raise NeedsSyncConnection(
            f"saga {saga.name} has an on_transition hook, which runs on a synchronous psycopg connection:"
            " start it with Saga.start on one (estafeta.sqlalchemy.connection(session) for a sync Session)"
        )
    return await run_async(conn, saga.start_plan(data, **options))


async def append_events(
    conn: psycopg.AsyncConnection[Any],
    store: EventStore,
    stream_id: str,
    events: Sequence[Any],
    *,
    expected_version: ExpectedVersion = ANY,
    stream_type: str | None = None,
    metadata: EventMetadata | None = None,
) -> list[RecordedEvent[Any]]:
    """:meth:`EventStore.append <estafeta.EventStore.append>` on an async connection, with its conflicts."""
    plan = store.append_plan(
        stream_id, events, expected_version=expected_version, stream_type=stream_type, metadata=metadata
    )
    return await run_async(conn, plan)


async def run_idempotent(
    conn: psycopg.AsyncConnection[Any], idempotency: Idempotency, request: IdempotentRequest, handler: AsyncHandler
) -> HttpResponse:
    """:meth:`Idempotency.run_on <estafeta.Idempotency.run_on>` on an async autocommit connection.

    The transactions are this function's: ``handler(conn)`` runs in the one that claims the
    key and stores the record, and its writes commit with the record or not at all.
    """
    if not conn.autocommit:
        raise ValueError("run_idempotent needs an autocommit connection: its transactions are its own")

    async def perform(step: Step) -> Any:
        return await handler(conn) if step is Step.HANDLE else await boundary_async(conn, step)

    return await run_async(conn, idempotency.plan_for(request), perform)
