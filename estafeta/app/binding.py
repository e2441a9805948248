"""Binding an app: its steps declared as Dramatiq actors on a broker, run with a runtime.

:meth:`estafeta.App.bind` calls :func:`bind_app` (or :func:`bind_from_env`) and makes the
:class:`~estafeta.app.app.Binding` of what it returns. The functions here see the app only as
:class:`Bindable` (its services, steps, sagas and schedules): the app's module imports this
one, never the other way round, and nothing this one imports (the watchdog, the scheduler,
the pruner it adds to the broker) needs the app's either.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

import dramatiq
from dramatiq.brokers.stub import StubBroker

from estafeta.app.errors import SettingsError
from estafeta.app.middleware import (
    EmbeddedDatabaseNotice,
    MovedClockWarning,
    RefuseRefusedDatabase,
    RefuseStubBroker,
    WorkerLogs,
    find_middleware,
    has_middleware,
)
from estafeta.app.runtime import Runtime
from estafeta.app.settings import Settings
from estafeta.events.projections import Projector
from estafeta.events.projector_run import ProjectorsMiddleware
from estafeta.observability import tracing as tracing
from estafeta.observability.heartbeats import WorkerHeartbeat
from estafeta.observability.liveness import ServiceSpec
from estafeta.observability.worker_metrics import WorkerMetrics
from estafeta.operations.retention import PruneMiddleware
from estafeta.sagas.watchdog import WatchdogMiddleware
from estafeta.schedules.scheduler import SchedulerMiddleware
from estafeta.steps.declare import declare_actors
from estafeta_brokers import broker_from_url
from estafeta_brokers.tracing import messaging_system

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga
    from estafeta.schedules.spec import Schedule
    from estafeta.steps.spec import StepSpec


class Bindable(Protocol):
    """What binding needs of an app (an :class:`estafeta.App`): what its workers serve and run."""

    @property
    def services(self) -> list[Service]:
        """Every service the app's workers serve."""

    @property
    def service_names(self) -> list[str]:
        """Their names."""

    @property
    def steps(self) -> dict[str, StepSpec]:
        """Every step, by actor name."""

    @property
    def sagas(self) -> list[Saga]:
        """Every saga kind (the watchdog's, the pruner's, the metrics')."""

    @property
    def schedules(self) -> list[Schedule]:
        """Every recurring schedule (the scheduler's)."""


class Declared(NamedTuple):
    """An app's steps declared on a broker: the fields of a :class:`~estafeta.app.app.Binding` but its app."""

    #: The broker every step is declared on (Dramatiq's global broker).
    broker: dramatiq.Broker
    #: Settings, pools and the lock backend of this process.
    runtime: Runtime
    #: The declared actors, by name (``<service>.<step>``).
    actors: Mapping[str, dramatiq.Actor[..., None]]


def bind_app(
    app: Bindable, broker: dramatiq.Broker | None, runtime: Runtime | None, *, watchdog: bool, projectors: bool = True
) -> Declared:
    """Declare ``app``'s steps on ``broker`` (built from the runtime's settings if ``None``)."""
    runtime = runtime or Runtime(Settings.from_env())
    if broker is None:
        broker = broker_from_url(runtime.settings.broker_url, **runtime.settings.broker_options)
        if isinstance(broker, StubBroker):
            broker.add_middleware(RefuseStubBroker())
        # Only the `dramatiq` command's worker processes emit process_boot: these act there.
        broker.add_middleware(WorkerLogs(runtime.settings.log_format))
        broker.add_middleware(WorkerHeartbeat(runtime, {spec.queue_name for spec in app.steps.values()}))
        if runtime.settings.metrics_port is not None:
            broker.add_middleware(WorkerMetrics(app.service_names, app.sagas, ServiceSpec.of_app(app)))
    if runtime.embedded and not has_middleware(broker, EmbeddedDatabaseNotice):
        broker.add_middleware(EmbeddedDatabaseNotice())
    _per_service(broker, MovedClockWarning, runtime, app)
    _per_service(broker, RefuseRefusedDatabase, runtime, app)
    dramatiq.set_broker(broker)
    tracing.use_messaging_system(messaging_system(broker))
    actors = declare_actors(broker, runtime, app.steps.values())
    if watchdog and app.sagas:
        _watch(broker, runtime, app)
    if watchdog and app.schedules:
        _schedule(broker, runtime, app)
    if runtime.settings.prune_interval:
        _prune(broker, runtime, app)
    if projectors:
        _project(broker, runtime, app)
    return Declared(broker, runtime, actors)


def _per_service(
    broker: dramatiq.Broker, kind: type[MovedClockWarning | RefuseRefusedDatabase], runtime: Runtime, app: Bindable
) -> None:
    # Every `dramatiq` worker process checks at boot, for each of its services, that its clock
    # is PostgreSQL's (a warning) and that the server accepts its database (a refusal): one
    # middleware of each kind per broker, extended by each app bound to it.
    existing = find_middleware(broker, kind)
    if existing is None:
        broker.add_middleware(kind(runtime, app.service_names))
        return
    existing.services.extend(s for s in app.service_names if s not in existing.services)


def _schedule(broker: dramatiq.Broker, runtime: Runtime, app: Bindable) -> None:
    # Every worker process fires due schedules; the row lock makes each tick fire once.
    existing = find_middleware(broker, SchedulerMiddleware)
    if existing is None:
        broker.add_middleware(SchedulerMiddleware(runtime, app.schedules))
        return
    existing.schedules.extend(s for s in app.schedules if s not in existing.schedules)


def _prune(broker: dramatiq.Broker, runtime: Runtime, app: Bindable) -> None:
    # Every worker process prunes the app's tables now and then (ESTAFETA_PRUNE_INTERVAL).
    existing = find_middleware(broker, PruneMiddleware)
    if existing is None:
        broker.add_middleware(PruneMiddleware(runtime, app.services, app.sagas))
    else:
        existing.adopt(app.services, app.sagas)


def _project(broker: dramatiq.Broker, runtime: Runtime, app: Bindable) -> None:
    # Every worker process runs the app's projectors (one applies each projection, the others stand by).
    found = [
        Projector(projection, service.event_store)
        for service in app.services
        if service.event_store is not None
        for projection in service.projections
    ]
    if found and not has_middleware(broker, ProjectorsMiddleware):
        broker.add_middleware(ProjectorsMiddleware(runtime, found))


def _watch(broker: dramatiq.Broker, runtime: Runtime, app: Bindable) -> None:
    # Every worker process watches saga deadlines: restarting the workers resumes every saga.
    existing = find_middleware(broker, WatchdogMiddleware)
    if existing is None:
        broker.add_middleware(WatchdogMiddleware(runtime, app.sagas))
        return
    existing.sagas.extend(saga for saga in app.sagas if saga not in existing.sagas)


def bind_from_env(app: Bindable, *, watchdog: bool, projectors: bool = True) -> Declared:
    """``bind_app`` with the ``ESTAFETA_*`` settings; a bad one ends the process with one line, exit code 2."""
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"estafeta: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return bind_app(app, None, Runtime(settings), watchdog=watchdog, projectors=projectors)
