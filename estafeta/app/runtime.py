"""What steps need while they run: settings, one pool per service database, the lock backend."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from estafeta.app.settings import Settings
from estafeta.messaging.wakeups import Waker
from estafeta_sql import embedded, migrate
from estafeta_sql.pool import Database

if TYPE_CHECKING:
    from estafeta.locks.step_locks import LockBackend
    from estafeta.steps.spec import StepSpec

logger = logging.getLogger(__name__)

#: Where a step takes its connection from: given the pool of the step's service, a context
#: manager lending an idle connection (see :class:`Runtime`).
StepConnections = Callable[[Database], AbstractContextManager[psycopg.Connection[Any]]]


class Migratable(Protocol):
    """A service as migrations see it: a schema name and its ordered migrations."""

    @property
    def name(self) -> str:
        """The schema."""

    def migrations(self) -> list[migrate.Migration]:
        """Every migration of the schema, in the order they apply."""


class Runtime:
    """The resources of one process, built from :class:`Settings`: a pool per database, the lock backend.

    Services that share a DSN share one pool. ``embedded`` starts (or joins) the
    private pgserver on first use, not at construction; nothing connects before a
    pool is first used.
    """

    def __init__(self, settings: Settings, *, step_connections: StepConnections | None = None) -> None:
        self.settings = settings
        #: Where each step takes the connection of its transaction: the service's pool unless
        #: given (``estafeta.django.step_connections`` lends Django's connection of the thread).
        self.step_connections: StepConnections = step_connections or _pooled
        self._databases: dict[str, Database] = {}
        self._embedded_dsn: str | None = None
        self._locks: LockBackend | None = None
        self._wakers: dict[str, Waker] = {}
        #: The steps declared on a broker in this process, by actor name: where a hand-off
        #: may go (``estafeta.messaging.handoff``).
        self.steps_here: dict[str, StepSpec] = {}
        #: The queues the worker of this process consumes (``dramatiq ... --queues``), told
        #: at its boot; ``None``: every queue. A hand-off goes only to a step of one of them.
        self.queues_here: frozenset[str] | None = None
        self._mutex = threading.Lock()
        #: Whether each database's first use connects in the caller's thread before its pool
        #: starts (:class:`estafeta_sql.pool.Database`): the CLI's commands report a refused or
        #: unreachable server at once rather than after the pool's 10 s of retries.
        self.connect_first = False
        self._check_before_use = False

    def dsn_for(self, service: str) -> str:
        """The resolved DSN of ``service``'s database."""
        dsn = self.settings.database_url_for(service)
        if dsn != "embedded":
            return dsn
        with self._mutex:
            if self._embedded_dsn is None:
                self._embedded_dsn = embedded.start()
            return self._embedded_dsn

    def dsns(self) -> list[str]:
        """Every resolved DSN the settings name: the default database's first, then each service's own."""
        default = self.dsn_for("")  # no service is named "": the default database
        own = sorted({self.dsn_for(service) for service in self.settings.service_database_urls})
        return [default, *(dsn for dsn in own if dsn != default)]

    def database(self, service: str) -> Database:
        """The pool of ``service``'s database."""
        dsn = self.dsn_for(service)
        with self._mutex:
            database = self._databases.get(dsn)
            if database is None:
                # ESTAFETA_WAKEUP=poll: no NOTIFY from any transaction on these connections.
                quiet = {"estafeta.wakeup": "poll"} if self.settings.wakeup == "poll" else None
                database = self._databases[dsn] = Database(
                    dsn,
                    max_size=self.settings.pool_size,
                    connect_first=self.connect_first,
                    session_settings=quiet,
                    check_before_use=self._check_before_use,
                    setting=self.settings.variable_of(service),
                )
            return database

    def check_connections_before_use(self) -> None:
        """From now on, every pool of this runtime (made already or later) checks a connection before lending it.

        A connection the server dropped while it sat in the pool (a restart, a failover) is then
        replaced before anyone uses it, for one round trip per borrow (see
        :attr:`estafeta_sql.pool.Database.check_before_use`): what ``estafeta serve`` does, where a dead
        connection would be a request's error.
        """
        with self._mutex:
            self._check_before_use = True
            for database in self._databases.values():
                database.check_before_use = True

    @property
    def wakes_after_commit(self) -> bool:
        """Whether steps send their wake-ups after the commit (``ESTAFETA_WAKEUP=after-commit``)."""
        return self.settings.wakeup == "after-commit"

    def wake_after_commit(self, database: Database, schema: str, *, relays: bool = True) -> None:
        """Hand ``schema``'s wake-up to ``database``'s :class:`~estafeta.messaging.wakeups.Waker` (a step committed).

        ``relays=False``: its projectors only (see :meth:`~estafeta.messaging.wakeups.Waker.wake`).
        """
        with self._mutex:
            waker = self._wakers.get(database.dsn)
            if waker is None:
                waker = self._wakers[database.dsn] = Waker(database.dsn)
        waker.wake(schema, relays=relays)

    @property
    def embedded(self) -> bool:
        """Whether some service's database is the embedded PostgreSQL."""
        urls = [self.settings.database_url, *self.settings.service_database_urls.values()]
        return "embedded" in urls

    @property
    def locks(self) -> LockBackend:
        """The lock backend chosen by ``ESTAFETA_LOCK_URL``."""
        with self._mutex:
            if self._locks is None:
                from estafeta.locks.step_locks import backend_from_url

                self._locks = backend_from_url(self.settings)
            return self._locks

    def migrate(self, services: Iterable[Migratable], *, check: bool = False) -> dict[str, list[str]]:
        """Apply (or, with ``check``, only list) the pending migrations of ``services``, by service.

        Safe to run twice and from several processes at once (an advisory lock serialises
        migrators).
        """
        result: dict[str, list[str]] = {}
        for service in services:
            with self.database(service.name).connection() as conn:
                migrations = service.migrations()
                if check:
                    result[service.name] = migrate.pending(conn, service.name, migrations)
                else:
                    result[service.name] = migrate.apply(conn, service.name, migrations)
        return result

    def close(self) -> None:
        """Close every pool and lock connection."""
        with self._mutex:
            for database in self._databases.values():
                database.close()
            self._databases.clear()
            for waker in self._wakers.values():
                waker.close()
            self._wakers.clear()
            if self._locks is not None:
                self._locks.close()
                self._locks = None


def _pooled(database: Database) -> AbstractContextManager[psycopg.Connection[Any]]:
    return database.connection()
