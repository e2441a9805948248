"""estafeta on SQLAlchemy 2.x sessions (the ``sqlalchemy`` extra): the outbox in the ORM's own transaction.

::

    from estafeta import sqlalchemy as es

    with Session(engine) as session, session.begin():
        session.add(Order(id=order_id, total=42))
        es.send(session, orders, ChargePayment(order_id))   # commits with the Order, or not at all

Every function here works on a ``Session`` or a ``Connection`` whose engine uses the psycopg
driver (``postgresql+psycopg://``): it writes through the psycopg connection under the
caller's transaction, with the same SQL as the rest of estafeta, so the ORM's flush and
the outbox rows commit together. A session on another driver raises
:class:`UnsupportedDriver`; a ``Connection`` with no transaction begun, or an engine in
``AUTOCOMMIT``, raises :class:`NoTransaction` (the row would commit on its own).
:mod:`estafeta.sqlalchemy.asyncio` does the same for ``AsyncSession``.

Inside a step, :func:`session` is an ORM ``Session`` on the step's own transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from estafeta.app import errors as _errors
from estafeta.events.store import ANY, EventMetadata, EventStore, ExpectedVersion, RecordedEvent
from estafeta.idempotency.keys import Idempotency, IdempotentRequest, Step
from estafeta.idempotency.problem import HttpResponse
from estafeta_sql import plan
from estafeta_sql.errors import EstafetaError

from ._step_session import Lent, SessionRolledBack, session

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga

__all__ = [
    "NoTransaction",
    "SessionHandler",
    "SessionRolledBack",
    "UnsupportedDriver",
    "append_events",
    "connection",
    "publish",
    "run_idempotent",
    "send",
    "session",
    "start_saga",
]

#: A handler for :func:`run_idempotent`: given the session in the record's transaction, do the work and answer.
SessionHandler = Callable[[Session], HttpResponse]


class UnsupportedDriver(EstafetaError, sqlalchemy.exc.InvalidRequestError):
    """The session's engine does not use the psycopg driver: use a ``postgresql+psycopg://`` URL."""


class NoTransaction(_errors.NoTransaction, sqlalchemy.exc.InvalidRequestError):
    """No transaction is open on this connection: what estafeta wrote would commit on its own."""


def connection(bind: Session | Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``bind``'s current transaction (a ``Session`` begins one as it always does).

    Raises :class:`UnsupportedDriver` unless the engine uses psycopg, and
    :class:`NoTransaction` for a ``Connection`` with no transaction begun or an engine in
    ``AUTOCOMMIT``.
    """
    sa_connection = _connection_of(bind)
    driver = sa_connection.connection.driver_connection
    if isinstance(driver, Lent):  # a step's session: the step's own connection and transaction
        return driver.conn
    return checked(sa_connection, driver, psycopg.Connection)  # type: ignore[no-any-return]


def _connection_of(bind: Session | Connection) -> Connection:
    if isinstance(bind, Connection):
        return bind
    if not isinstance(bind, Session):
        raise TypeError(f"expected a SQLAlchemy Session or Connection, got {type(bind).__name__}")
    try:
        return bind.connection()
    except sqlalchemy.exc.InvalidRequestError as exc:  # autobegin=False and no begin()
        raise NoTransaction(f"the session has no transaction: {exc}") from None


def checked(sa_connection: Any, driver: Any, kind: type[Any]) -> Any:
    """``driver`` if it is a psycopg connection of ``kind`` in ``sa_connection``'s open transaction."""
    if not isinstance(driver, kind):
        dialect = sa_connection.dialect
        raise UnsupportedDriver(
            f"estafeta writes through psycopg 3, but this engine uses {dialect.name}+{dialect.driver}"
            f" ({type(driver).__module__}.{type(driver).__name__}): create it with a postgresql+psycopg:// URL"
        )
    if not sa_connection.in_transaction():
        raise NoTransaction(
            "this Connection has no transaction begun: call conn.begin() (or use a Session), so that"
            " estafeta's rows commit with your writes"
        )
    if driver.autocommit:
        raise NoTransaction(
            "this connection is in AUTOCOMMIT (isolation_level='AUTOCOMMIT'): every statement commits on its own,"
            " so estafeta's rows could not commit with your writes; use an engine without it"
        )
    return driver


def send(bind: Session | Connection, service: Service, command: Any, **options: Any) -> uuid.UUID:
    """:meth:`Service.send <estafeta.Service.send>` in ``bind``'s transaction; return the message id."""
    return service.send(connection(bind), command, **options)


def publish(bind: Session | Connection, service: Service, event: Any, **options: Any) -> list[uuid.UUID]:
    """:meth:`Service.publish <estafeta.Service.publish>` in ``bind``'s transaction; return the message ids."""
    return service.publish(connection(bind), event, **options)


def start_saga(bind: Session | Connection, saga: Saga, data: Any, **options: Any) -> uuid.UUID:
    """:meth:`Saga.start <estafeta.Saga.start>` in ``bind``'s transaction; return the saga id."""
    return saga.start(connection(bind), data, **options)


def append_events(
    bind: Session | Connection,
    store: EventStore,
    stream_id: str,
    events: Sequence[Any],
    *,
    expected_version: ExpectedVersion = ANY,
    stream_type: str | None = None,
    metadata: EventMetadata | None = None,
) -> list[RecordedEvent[Any]]:
    """:meth:`EventStore.append <estafeta.EventStore.append>` in ``bind``'s transaction."""
    return store.append(
        connection(bind),
        stream_id,
        events,
        expected_version=expected_version,
        stream_type=stream_type,
        metadata=metadata,
    )


def run_idempotent(
    session: Session, idempotency: Idempotency, request: IdempotentRequest, handler: SessionHandler
) -> HttpResponse:
    """:meth:`Idempotency.run <estafeta.Idempotency.run>` on an ORM session: ``handler(session)`` with the record.

    The session must have no transaction open: the transactions are this function's
    (``session.begin()``, ``commit()``, ``rollback()``). What ``handler`` adds to the
    session commits with the key's record; an answer of 400 or more, or an exception,
    rolls it back (the rules of :class:`estafeta.Idempotency`).
    """
    if session.in_transaction():
        raise sqlalchemy.exc.InvalidRequestError(
            "run_idempotent begins and ends its own transactions: pass a session with none open"
        )

    def perform(op: Any) -> Any:
        if isinstance(op, plan.Statement):
            return plan.execute(connection(session), op)
        if isinstance(op, plan.SyncOnly):
            return op.fn(connection(session))
        if op is Step.HANDLE:
            return handler(session)
        if op is Step.BEGIN:
            session.begin()
        elif op is Step.COMMIT:
            session.commit()
        else:
            session.rollback()
        return None

    return plan.drive(idempotency.plan_for(request), perform)
