"""Services: what a team declares, each a schema, a queue and the steps, sagas, schedules and events of its own.

A :class:`Service` owns a PostgreSQL schema of its own name (its business tables, its
outbox, inbox and dead letters), a Dramatiq queue of that name, and its steps. It is apart
from :mod:`estafeta.app.app` (the :class:`~estafeta.app.app.App` that assembles services and
binds them to a broker) because everything declared on a service (its steps, sagas and
schedules) needs the service, and none of it the binding. A service knows its app only as
:class:`ServiceApp` (its name, and the steps a message type reaches), so this module does
not import the app's.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from importlib.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import psycopg

from estafeta.app.errors import RoutingError, require_transaction
from estafeta.events.projections import Projection
from estafeta.events.store import EventRegistry, EventStore
from estafeta.messaging import outbox as outbox
from estafeta.schedules.spec import CatchUp, Overlap, Schedule, timing_of
from estafeta.steps.spec import Router, StepSpec
from estafeta_sql import migrate
from estafeta_sql.plan import Statement

if TYPE_CHECKING:
    from estafeta.sagas.saga import Saga

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_RESERVED = {"public", "information_schema"}
#: The messaging tables every service schema carries (outbox, inbox, dead letters, fences).
COMMON_MIGRATIONS = "_common"
#: The event store's tables, for services that opt in (:meth:`Service.use_events`).
EVENTS_MIGRATIONS = "_events"
#: The schedules table, for services that declare a schedule (:meth:`Service.schedule`).
SCHEDULES_MIGRATIONS = "_schedules"


class ServiceApp(Router, Protocol):
    """The app a service belongs to (an :class:`estafeta.App`), as the service sees it.

    The steps handling each message type (:meth:`handlers`: where the service's messages
    go), and the app's name (for errors).
    """

    @property
    def name(self) -> str:
        """The app's name."""


class Service:
    """A service: its name is its schema, its queue and the prefix of its actors' names.

    ``migrations`` are directories of numbered ``.sql`` files (``0001_accounts.sql``...),
    applied with ``search_path`` set to the service's schema, after the messaging tables
    every service carries.
    """

    def __init__(self, name: str, *, migrations: Iterable[Traversable | Path | str] | Traversable | Path | str = ()):
        if not _NAME.match(name) or name in _RESERVED or name.startswith("pg_"):
            raise ValueError(f"service name {name!r} must be a lower-case identifier usable as a schema name")
        self.name = name
        if isinstance(migrations, str | Path | Traversable):
            migrations = [migrations]
        #: Directories of the service's own migrations.
        self.migration_dirs: tuple[Traversable, ...] = tuple(Path(d) if isinstance(d, str) else d for d in migrations)
        self._builtin: list[str] = [COMMON_MIGRATIONS]
        self._steps: dict[str, StepSpec] = {}
        self._sagas: list[Saga] = []
        self._app: ServiceApp | None = None
        #: The service's event store, once it opted in with :meth:`use_events`.
        self.event_store: EventStore | None = None
        self._aggregates: list[type] = []
        self._projections: list[Projection] = []
        self._schedules: dict[str, Schedule] = {}

    def __repr__(self) -> str:
        return f"Service({self.name!r})"

    def step(
        self,
        handles: type,
        *,
        name: str | None = None,
        lock: Callable[[Any], str] | None = None,
        opening: Callable[[Any], Statement | None] | None = None,
        **actor_options: Any,
    ) -> Callable[[Callable[..., Any]], StepSpec]:
        """Declare ``fn(ctx, command)`` as the step ``<service>.<name>`` handling ``handles`` messages.

        Every message is one transaction: inbox, lock, the function, its outbox rows, its
        reply. ``lock`` maps the command to a key (an order id): steps on the same key never
        run their transactions at the same time, whichever process runs them. Other keyword
        arguments are Dramatiq actor options (``max_retries``, ``min_backoff``...). The
        decorated name becomes the :class:`StepSpec` (still callable as ``fn(ctx, command)``).

        ``opening`` maps the command to a statement (:class:`Statement`) run in the step's
        first round trip, after its inbox record, its lock and its savepoint, in place of the
        function's first round trip: the row the step is about, locked (``FOR UPDATE``). Its
        rows reach the function as ``ctx.opening`` (dicts); ``None`` when it gives no statement,
        and when ``lock`` is a Redis lock (``ESTAFETA_LOCK_URL``), taken after that round trip:
        the function then reads for itself. A duplicate delivery runs it too, and ignores it.
        """

        def decorate(fn: Callable[..., Any]) -> StepSpec:
            spec = StepSpec(
                self.name, name or fn.__name__, handles, fn, lock, actor_options, owner=self, opening=opening
            )
            existing = self._steps.get(spec.actor_name)
            if existing is not None and existing.fn is not fn:
                raise ValueError(f"a step named {spec.actor_name!r} is already declared")
            self._steps[spec.actor_name] = spec
            return spec

        return decorate

    @property
    def steps(self) -> Mapping[str, StepSpec]:
        """The service's steps by actor name."""
        return dict(self._steps)

    def schedule(
        self,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        tz: str = "UTC",
        name: str | None = None,
        overlap: Overlap | str = Overlap.SKIP,
        catch_up: CatchUp | str = CatchUp.LAST,
        grace: timedelta = timedelta(minutes=1),
    ) -> Callable[[Callable[[datetime], Any]], Schedule]:
        """Declare ``fn(tick)`` as a recurring schedule of this service: each tick sends the command it returns.

        Give a cron expression (``"*/5 * * * *"``, read in the IANA time zone ``tz``) or
        ``every=timedelta(...)`` (ticks at whole multiples of it since the Unix epoch).
        Each tick is fired once across every worker process: one transaction claims it
        and writes the command to this service's outbox (routed like :meth:`send`); the
        relay publishes it. ``fn`` gets the tick (a UTC datetime) and returns the command,
        or ``None`` to send nothing. ``overlap``: ``"skip"`` (the default) does not fire
        while the message the previous firing sent is not yet processed by its step,
        ``"allow"`` fires anyway. ``catch_up``, for ticks that fell while nothing fired
        (every worker down): ``"all"`` fires each, ``"last"`` (the default) the latest
        only, ``"none"`` none that is more than ``grace`` late. ``migrate`` creates the
        service's schedules table.
        """
        timing = timing_of(cron, every, tz)

        def decorate(fn: Callable[[datetime], Any]) -> Schedule:
            found = Schedule(
                self,
                name or fn.__name__,
                timing,
                fn,
                overlap=_policy(Overlap, "overlap", overlap),
                catch_up=_policy(CatchUp, "catch_up", catch_up),
                grace=grace,
            )
            if not _NAME.match(found.name):
                raise ValueError(f"schedule name {found.name!r} must be a lower-case identifier")
            if found.name in self._schedules:
                raise ValueError(f"service {self.name} already has a schedule named {found.name!r}")
            self.use_builtin_migrations(SCHEDULES_MIGRATIONS)
            self._schedules[found.name] = found
            return found

        return decorate

    @property
    def schedules(self) -> list[Schedule]:
        """The service's recurring schedules, in declaration order."""
        return list(self._schedules.values())

    @property
    def sagas(self) -> list[Saga]:
        """The sagas orchestrated by this service."""
        return list(self._sagas)

    def adopt_saga(self, saga: Saga) -> None:
        """Record a saga orchestrated here (:class:`Saga` calls it when declared)."""
        if any(s.name == saga.name for s in self._sagas):
            raise ValueError(f"service {self.name} already has a saga named {saga.name!r}")
        self._sagas.append(saga)

    def use_events(self, registry: EventRegistry, *, aggregates: Iterable[type] = ()) -> EventStore:
        """Give this service an event store in its schema, for the event types of ``registry``.

        ``migrate`` then creates the store's tables (streams, events, snapshots, projection
        checkpoints) in the service's schema; its steps append through ``ctx.events``. The
        registry's upcaster chains are checked now. ``aggregates`` are the classes whose
        streams ``estafeta events show`` can also show as state.
        """
        self.use_builtin_migrations(EVENTS_MIGRATIONS)
        self.event_store = EventStore(self.name, registry)
        self._aggregates = list(aggregates)
        return self.event_store

    def projection(self, projection: Projection) -> Projection:
        """Register a projection of this service's events (run by ``estafeta projections run``)."""
        if self.event_store is None:
            raise RoutingError(f"service {self.name} has no event store: call {self.name}.use_events(registry) first")
        if any(p.name == projection.name for p in self._projections):
            raise ValueError(f"service {self.name} already has a projection named {projection.name!r}")
        self._projections.append(projection)
        return projection

    @property
    def projections(self) -> list[Projection]:
        """The service's registered projections."""
        return list(self._projections)

    @property
    def aggregates(self) -> list[type]:
        """The aggregate classes given to :meth:`use_events`."""
        return list(self._aggregates)

    def use_builtin_migrations(self, name: str) -> None:
        """Add a directory of ``sql/migrations/`` (an opt-in feature's tables) to this service's schema."""
        if name not in self._builtin:
            self._builtin.append(name)

    def migrations(self) -> list[migrate.Migration]:
        """Every migration of this service's schema, in the order they apply.

        The messaging tables first, then opt-in built-in tables, the service's own
        migrations, and last the tables of each saga it orchestrates.
        """
        builtin = [migrate.builtin_directory(name) for name in self._builtin]
        return [
            *migrate.load([*builtin, *self.migration_dirs]),
            *(m for saga in self._sagas for m in saga.migrations()),
        ]

    @property
    def app(self) -> ServiceApp:
        """The app this service belongs to."""
        if self._app is None:
            raise RoutingError(f"service {self.name} belongs to no App: declare App(..., services=[...]) first")
        return self._app

    @property
    def router(self) -> ServiceApp:
        """Where this service's messages are routed: its app."""
        return self.app

    def send(self, conn: psycopg.Connection[Any], command: Any, **options: Any) -> uuid.UUID:
        """Write ``command`` to this service's outbox in the caller's transaction; return its message id.

        It goes to the one step of the app that handles its type (or ``to=Address(...)``).
        The row commits or rolls back with the caller's other changes; the relay publishes
        it after the commit. Options: ``delay`` (seconds or a ``timedelta``) or ``at`` (a
        timezone-aware instant) to hold it until then, ``ordering_key``, ``saga_id``,
        ``message_id``, ``options``, ``traceparent``. The returned id is what
        :meth:`cancel` and :meth:`reschedule` take while it waits. A connection in autocommit
        with no transaction open is refused (:class:`NoTransaction`): the row would commit alone.
        """
        require_transaction(conn, "Service.send")
        return outbox.send(conn, command, service=self.name, router=self.router, **options)

    def cancel(self, conn: psycopg.Connection[Any], message_id: uuid.UUID) -> None:
        """Take the message :meth:`send` returned ``message_id`` for out of the outbox (:func:`estafeta.cancel`)."""
        outbox.cancel(conn, message_id, service=self.name)

    def reschedule(self, conn: psycopg.Connection[Any], message_id: uuid.UUID, at: datetime) -> None:
        """Make the waiting message ``message_id`` due at ``at`` instead (:func:`estafeta.reschedule`)."""
        outbox.reschedule(conn, message_id, at, service=self.name)

    def publish(self, conn: psycopg.Connection[Any], event: Any, **options: Any) -> list[uuid.UUID]:
        """Write ``event`` once for every step of the app subscribed to its type; return the message ids.

        An event no step subscribes to raises :class:`RoutingError` unless ``unheard_ok=True``
        (see :func:`estafeta.messaging.outbox.publish`). Other options: ``ordering_key``, ``saga_id``,
        ``options``, ``traceparent``. A connection with no transaction open is refused, as by :meth:`send`.
        """
        require_transaction(conn, "Service.publish")
        return outbox.publish(conn, event, service=self.name, router=self.router, **options)

    def _join(self, app: ServiceApp) -> None:
        if self._app is not None and self._app is not app:
            raise ValueError(f"service {self.name} already belongs to app {self._app.name!r}")
        self._app = app


_P = TypeVar("_P", Overlap, CatchUp)


def _policy(kind: type[_P], name: str, value: _P | str) -> _P:
    try:
        return kind(value)
    except ValueError:
        choices = " or ".join(repr(p.value) for p in kind)
        raise ValueError(f"{name}={value!r}: say {choices}") from None
