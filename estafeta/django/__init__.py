"""estafeta in Django (the ``django`` extra): the outbox inside ``transaction.atomic()``.

Add ``"estafeta.django"`` to ``INSTALLED_APPS`` (an app with no models of its own), and in a
view::

    from django.db import transaction
    from estafeta import django as es

    with transaction.atomic():
        Order.objects.create(id=order_id, total=42)
        es.send(orders, ChargePayment(order_id))     # commits with the Order, or not at all

Every function writes through the psycopg 3 connection of Django's PostgreSQL backend
(``using`` names the database alias), inside the current ``atomic`` block: Django's writes
and estafeta's rows commit together, and a nested ``atomic`` (a savepoint) that rolls back
takes the rows written inside it. Outside ``atomic`` (Django's autocommit, where each
statement commits on its own) :class:`NoTransaction` is raised; a backend other than
PostgreSQL on psycopg 3 raises :class:`UnsupportedBackend`. Both are Django's
``TransactionManagementError`` / ``ImproperlyConfigured`` too.

estafeta's tables live in each service's own schema and are created by ``estafeta migrate``;
Django's migrations never touch them (see ``docs/how-to/django.md`` for the order to run both).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import dramatiq
import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.transaction import TransactionManagementError

from estafeta.app import errors as _errors
from estafeta.app.runtime import StepConnections
from estafeta.events.store import ANY, EventMetadata, EventStore, ExpectedVersion, RecordedEvent
from estafeta.idempotency.keys import Idempotency, IdempotentRequest, Step
from estafeta.idempotency.problem import HttpResponse
from estafeta_sql import plan
from estafeta_sql.errors import EstafetaError
from estafeta_sql.pool import Database

logger = logging.getLogger(__name__)
_warned_max_age: set[str] = set()

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga

__all__ = [
    "CloseConnections",
    "NoTransaction",
    "OtherDatabase",
    "UnsupportedBackend",
    "append_events",
    "connection",
    "publish",
    "run_idempotent",
    "send",
    "start_saga",
    "step_connections",
]


class UnsupportedBackend(EstafetaError, ImproperlyConfigured):
    """This database alias is not PostgreSQL on psycopg 3: estafeta writes through psycopg 3 only."""


class OtherDatabase(EstafetaError, ImproperlyConfigured):
    """A step's service lives in another database than Django's: its ORM cannot share the step's transaction."""


class NoTransaction(_errors.NoTransaction, TransactionManagementError):
    """Not inside ``transaction.atomic()``: what estafeta wrote would commit on its own."""


def connection(using: str = DEFAULT_DB_ALIAS) -> psycopg.Connection[Any]:
    """The psycopg connection of Django's ``using`` database, inside its current ``atomic`` block."""
    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise UnsupportedBackend(f"database {using!r} is {wrapper.vendor}: estafeta needs PostgreSQL (psycopg 3)")
    if not wrapper.in_atomic_block:
        raise NoTransaction(
            f"database {using!r} is not inside transaction.atomic(): wrap the writes and estafeta's call in one,"
            " so that they commit together"
        )
    wrapper.ensure_connection()
    driver = wrapper.connection
    if not isinstance(driver, psycopg.Connection):
        raise UnsupportedBackend(
            f"database {using!r} runs on {type(driver).__module__} (psycopg2?): estafeta needs psycopg 3;"
            " install psycopg (Django uses it when both are installed)"
        )
    if wrapper.needs_rollback:
        raise TransactionManagementError(
            "An error occurred in the current transaction. You can't execute queries until the end of the"
            " 'atomic' block."
        )
    return driver


def send(service: Service, command: Any, *, using: str = DEFAULT_DB_ALIAS, **options: Any) -> uuid.UUID:
    """:meth:`Service.send <estafeta.Service.send>` in the current ``atomic`` block; return the message id."""
    return service.send(connection(using), command, **options)


def publish(service: Service, event: Any, *, using: str = DEFAULT_DB_ALIAS, **options: Any) -> list[uuid.UUID]:
    """:meth:`Service.publish <estafeta.Service.publish>` in the current ``atomic`` block; return the message ids."""
    return service.publish(connection(using), event, **options)


def start_saga(saga: Saga, data: Any, *, using: str = DEFAULT_DB_ALIAS, **options: Any) -> uuid.UUID:
    """:meth:`Saga.start <estafeta.Saga.start>` in the current ``atomic`` block; return the saga id."""
    return saga.start(connection(using), data, **options)


def append_events(
    store: EventStore,
    stream_id: str,
    events: Sequence[Any],
    *,
    expected_version: ExpectedVersion = ANY,
    stream_type: str | None = None,
    metadata: EventMetadata | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[RecordedEvent[Any]]:
    """:meth:`EventStore.append <estafeta.EventStore.append>` in the current ``atomic`` block."""
    return store.append(
        connection(using),
        stream_id,
        events,
        expected_version=expected_version,
        stream_type=stream_type,
        metadata=metadata,
    )


def run_idempotent(
    idempotency: Idempotency,
    request: IdempotentRequest,
    handler: Callable[[], HttpResponse],
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> HttpResponse:
    """:meth:`Idempotency.run <estafeta.Idempotency.run>` in Django: ``handler()`` in the record's ``atomic`` block.

    What the handler writes through Django's ORM commits with the key's record; an answer
    of 400 or more, or an exception, rolls it back (the rules of :class:`estafeta.Idempotency`).
    The transactions are this function's: call it outside any ``atomic`` block.
    """
    if connections[using].in_atomic_block:
        raise TransactionManagementError(
            "run_idempotent opens its own atomic blocks: call it outside transaction.atomic()"
        )
    blocks: list[Any] = []

    def perform(op: Any) -> Any:
        if isinstance(op, plan.Statement):
            return plan.execute(connection(using), op)
        if isinstance(op, plan.SyncOnly):
            return op.fn(connection(using))
        if op is Step.HANDLE:
            return handler()
        if op is Step.BEGIN:
            block = transaction.atomic(using=using)
            block.__enter__()
            blocks.append(block)
        else:
            if op is Step.ROLLBACK:
                transaction.set_rollback(True, using=using)
            blocks.pop().__exit__(None, None, None)
        return None

    return plan.drive(idempotency.plan_for(request), perform)


class CloseConnections(dramatiq.Middleware):
    """Close a worker thread's Django connections when the thread stops (workers with :func:`step_connections`)."""

    def before_worker_thread_shutdown(self, broker: dramatiq.Broker, thread: Any) -> None:
        connections.close_all()


def step_connections(using: str = DEFAULT_DB_ALIAS) -> StepConnections:
    """Steps run on Django's connection of their worker thread: the ORM writes in the step's transaction.

    Give it to the worker's runtime::

        runtime = Runtime(Settings.from_env(), step_connections=es.step_connections())
        broker = app.bind(runtime=runtime).broker
        broker.add_middleware(es.CloseConnections())  # each worker thread's connection, at exit

    In each step Django's ``using`` database is in manual transaction management
    (``transaction.set_autocommit(False)``, Django's own API) on the very psycopg connection
    that holds the step's inbox record and outbox rows: what the step writes with the ORM
    commits with them, or not at all. A step's ``transaction.atomic()`` is a savepoint in
    it; ``transaction.on_commit`` callbacks (registered inside ``atomic``) run after the
    step's commit, and not when it rolls back. Autocommit is back on once the step ends.
    The step's service must live in Django's database (:class:`OtherDatabase` otherwise).
    """

    def lend(database: Database) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        return _lent(database, using)

    return lend


@contextlib.contextmanager
def _lent(database: Database, using: str) -> Iterator[psycopg.Connection[Any]]:
    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise UnsupportedBackend(f"database {using!r} is {wrapper.vendor}: estafeta needs PostgreSQL (psycopg 3)")
    if wrapper.in_atomic_block:
        raise TransactionManagementError("a step opens its own transaction: run it outside transaction.atomic()")
    if wrapper.settings_dict.get("CONN_MAX_AGE") == 0 and using not in _warned_max_age:
        _warned_max_age.add(using)
        logger.warning(
            "Django's CONN_MAX_AGE of database %r is 0: every step opens a new connection;"
            " set it in the workers' settings (None, or a few minutes with CONN_HEALTH_CHECKS)",
            using,
        )
    wrapper.close_if_unusable_or_obsolete()  # the CONN_MAX_AGE rules of Django's requests
    wrapper.ensure_connection()
    driver = wrapper.connection
    if not isinstance(driver, psycopg.Connection):
        raise UnsupportedBackend(f"database {using!r} does not run on psycopg 3: estafeta needs it")
    _check_same_database(driver, database, using)
    transaction.set_autocommit(False, using=using)
    try:
        yield driver  # the step commits (or rolls back) its transaction on it
    except BaseException:
        _end(wrapper, using, committed=False)
        raise
    _end(wrapper, using, committed=True)


def _end(wrapper: Any, using: str, *, committed: bool) -> None:
    # The step's COMMIT or ROLLBACK has been sent: these only bring Django's bookkeeping
    # along (the driver has no transaction open, so nothing more reaches the server), and
    # autocommit back on runs the on_commit callbacks of a commit.
    try:
        if committed:
            transaction.commit(using=using)
        else:
            transaction.rollback(using=using)
        transaction.set_autocommit(True, using=using)
    except Exception:
        if committed:
            raise
        wrapper.close()  # a connection lost under the step: Django reconnects for the next one


#: What says two connections reach one database: its name and its cluster's system identifier
#: (one however the host is named, through a pooler too), or where the function is not
#: granted, the server's address and port as the connection sees them.
_IDENTITY = "SELECT current_database(), (SELECT system_identifier FROM pg_control_system())::text"
_ADDRESS = "SELECT current_database(), inet_server_addr()::text || ' port ' || inet_server_port()"
_identities: weakref.WeakKeyDictionary[psycopg.Connection[Any], tuple[Any, ...]] = weakref.WeakKeyDictionary()
_pool_identities: dict[str, tuple[Any, ...]] = {}
_identities_lock = threading.Lock()


def _identity(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    # Both ways on both connections: an identity and an address never compare equal.
    try:
        row = conn.execute(_IDENTITY).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        row = conn.execute(_ADDRESS).fetchone()
    assert row is not None
    return tuple(row)


def _check_same_database(driver: psycopg.Connection[Any], database: Database, using: str) -> None:
    # Asked once per Django connection and once per estafeta pool: not a round trip per step.
    with _identities_lock:
        django_side = _identities.get(driver)
        estafeta_side = _pool_identities.get(database.dsn)
    if django_side is None:
        django_side = _identity(driver)  # in autocommit: Django's connection is idle
        with _identities_lock:
            _identities[driver] = django_side
    if estafeta_side is None:
        with database.connection() as conn:
            estafeta_side = _identity(conn)
        with _identities_lock:
            _pool_identities[database.dsn] = estafeta_side
    if django_side != estafeta_side:
        raise OtherDatabase(
            f"the step's service is in database {database.description}, Django's {using!r} is"
            f" {django_side[0]!r} ({django_side[1]}): its ORM could not write in the step's transaction"
        )
