"""Heartbeats: every long-running process says, in each service it serves, that it is alive and what it serves.

A worker process (with the scheduler and projectors it runs), a relay, ``estafeta projections
run`` and ``estafeta serve`` each run one :class:`Heartbeat`: a daemon thread that, every
``ESTAFETA_HEARTBEAT_INTERVAL`` seconds, upserts one row per role in the ``heartbeats`` table
of each service it serves (``estafeta_sql.heartbeats``), on a pooled connection the process already
uses for its work: one short transaction per database and beat, never a connection of its
own. A clean stop deletes the rows; a process killed outright leaves them, and they read as
stale once :data:`estafeta_sql.heartbeats.MISSED_BEATS` beats are missed (``estafeta status``, the
console, ``estafeta_heartbeat_*`` metrics). Each beat also deletes, now and then, the rows
of processes that stopped beating more than :data:`PRUNE_AFTER` ago.

A database that cannot be reached costs only its own beat (logged once until it is back):
the rows in the other databases keep beating.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from importlib import metadata
from typing import TYPE_CHECKING, Any

import attrs
import dramatiq

from estafeta.app.middleware import find_middleware
from estafeta_sql import heartbeats as store
from estafeta_sql.pool import Database

if TYPE_CHECKING:
    from estafeta.app.runtime import Runtime
    from estafeta_brokers.relay import Relay

logger = logging.getLogger(__name__)

#: Rows that have not beat for this long are deleted by the beats of other processes.
PRUNE_AFTER = timedelta(days=1)
#: Every this many beats, a heartbeat prunes (and at its first beat).
PRUNE_EVERY = 100


class Kind(enum.Enum):
    """The role a process plays for a service."""

    WORKER = "worker"
    RELAY = "relay"
    PROJECTOR = "projector"
    SCHEDULER = "scheduler"
    SERVE = "serve"


@attrs.frozen
class Role:
    """One role of this process: its kind, and what it serves in each service (by schema)."""

    kind: Kind
    #: Service -> the queues, outboxes, projections or schedules it serves there.
    serves: Mapping[str, Sequence[str]]
    #: Worker threads, relay lanes, projections run.
    threads: int = 1


def estafeta_version() -> str:
    """The version of estafeta installed (its distribution's metadata, which ``estafeta.__version__`` sets)."""
    try:
        return metadata.version("estafeta")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class Heartbeat:
    """Beats ``roles`` every ``interval`` seconds into the database of each service (``database_of(service)``).

    :meth:`start` writes the first beat before it returns (when the databases answer), so a
    process is listed as soon as it serves; :meth:`stop` deletes the rows.
    """

    def __init__(self, roles: Iterable[Role], database_of: Callable[[str], Database], interval: float) -> None:
        self.roles = [role for role in roles if role.serves]
        self.database_of = database_of
        self.interval = interval
        #: This process's id in the rows (a pid may be reused; this never is).
        self.process_id = uuid.uuid4()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        self._failing: set[str] = set()
        self._host, self._pid, self._version = socket.gethostname(), os.getpid(), estafeta_version()

    @property
    def services(self) -> list[str]:
        """Every service some role serves."""
        return sorted({service for role in self.roles for service in role.serves})

    def beat_once(self) -> None:
        """Write one beat of every role, one transaction per database; a database that fails is logged and skipped."""
        prune = self._beats % PRUNE_EVERY == 0
        self._beats += 1
        for database, schemas in self._by_database().items():
            try:
                with database.transaction() as conn:
                    for schema in schemas:
                        store.beat(conn, schema, self._beats_of(schema))
                        if prune:
                            store.prune(conn, schema, PRUNE_AFTER)
            except Exception as exc:  # one database down costs its own beats only
                self._failed(database, exc)
            else:
                self._failing.discard(database.description)

    def _beats_of(self, schema: str) -> list[store.Beat]:
        return [
            store.Beat(
                self.process_id,
                role.kind.value,
                list(role.serves[schema]),
                role.threads,
                self._host,
                self._pid,
                self._version,
                self.interval,
            )
            for role in self.roles
            if schema in role.serves
        ]

    def _by_database(self) -> dict[Database, list[str]]:
        found: dict[Database, list[str]] = {}
        for service in self.services:
            found.setdefault(self.database_of(service), []).append(service)
        return found

    def _failed(self, database: Database, exc: Exception) -> None:
        if database.description not in self._failing:
            logger.warning("heartbeat: cannot beat in %s: %s", database.description, exc)
            self._failing.add(database.description)

    def start(self, *, first_beat_here: bool = True) -> Heartbeat:
        """Beat now, then every ``interval`` seconds in a daemon thread until :meth:`stop`.

        ``first_beat_here=False``: the thread beats first, so a database that does not answer
        never holds up the caller (a worker process's boot).
        """
        if not self.roles or self._thread is not None:
            return self
        self._stop.clear()
        if first_beat_here:
            self.beat_once()
        self._thread = threading.Thread(target=self._run, args=(not first_beat_here,), name="estafeta-heartbeat")
        self._thread.daemon = True
        self._thread.start()
        return self

    def _run(self, beat_first: bool) -> None:
        if beat_first:
            self.beat_once()
        while not self._stop.wait(self.interval):
            self.beat_once()

    def stop(self) -> None:
        """Stop beating and delete this process's rows (a clean stop)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=self.interval + 10)
        self._thread = None
        for database, schemas in self._by_database().items():
            try:
                with database.transaction() as conn:
                    for schema in schemas:
                        store.remove(conn, schema, self.process_id)
            except Exception as exc:  # its rows go stale, then are pruned
                logger.warning("heartbeat: cannot remove this process's rows in %s: %s", database.description, exc)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def worker_roles(broker: dramatiq.Broker, worker: Any, queues: Iterable[str]) -> list[Role]:
    """The roles of a worker process: the ``queues`` it consumes, the schedules and projections it runs.

    A queue is named after its service (``StepSpec.queue_name``), so each queue's row goes to
    that service. ``dramatiq ... --queues`` narrows the queues (the worker's whitelist).
    """
    from estafeta.events.projector_run import ProjectorsMiddleware
    from estafeta.schedules.scheduler import SchedulerMiddleware

    whitelist = set(getattr(worker, "consumer_whitelist", None) or ())
    consumed = sorted(q for q in set(queues) if not whitelist or q in whitelist)
    threads = int(getattr(worker, "worker_threads", 1))
    roles = [Role(Kind.WORKER, {queue: [queue] for queue in consumed}, threads)]
    scheduler = find_middleware(broker, SchedulerMiddleware)
    if scheduler is not None:
        schedules: dict[str, list[str]] = {}
        for schedule in scheduler.schedules:
            schedules.setdefault(schedule.service.name, []).append(schedule.full_name)
        roles.append(Role(Kind.SCHEDULER, schedules))
    projectors = find_middleware(broker, ProjectorsMiddleware)
    if projectors is not None:
        projections: dict[str, list[str]] = {}
        for projector in projectors.projectors:
            projections.setdefault(projector.schema, []).append(projector.checkpoint_name)
        roles.append(Role(Kind.PROJECTOR, projections, len(projectors.projectors)))
    return roles


class WorkerHeartbeat(dramatiq.Middleware):
    """Beats, from each worker process's boot to its shutdown, the roles :func:`worker_roles` finds."""

    def __init__(self, runtime: Runtime, queues: Iterable[str]) -> None:
        self.runtime = runtime
        self.queues = set(queues)
        self._heartbeat: Heartbeat | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        roles = worker_roles(broker, worker, self.queues)
        heartbeat = Heartbeat(roles, self.runtime.database, self.runtime.settings.heartbeat_interval)
        self._heartbeat = heartbeat.start(first_beat_here=False)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None


def relay_heartbeat(relays: Sequence[Relay], interval: float) -> Heartbeat:
    """The heartbeat of a relay process running ``relays`` as lanes, on the first lane's pools."""
    databases = {outbox.schema: outbox.database for outbox in relays[0].outboxes} if relays else {}
    role = Role(Kind.RELAY, {schema: [schema] for schema in databases}, len(relays))
    return Heartbeat([role], databases.__getitem__, interval)


def app_heartbeat(kind: Kind, serves: Mapping[str, Sequence[str]], runtime: Runtime, threads: int = 1) -> Heartbeat:
    """The heartbeat of a process playing ``kind`` for the services of ``serves``, on the runtime's pools."""
    return Heartbeat([Role(kind, serves, threads)], runtime.database, runtime.settings.heartbeat_interval)
