"""Who serves what: each service's heartbeats, and the work nobody live is there to do.

Read by ``estafeta status``, the console's front page and the ``estafeta_heartbeat_*``
metrics. Three conditions are flagged (:class:`Condition`): an outbox with pending rows and
no live relay, a queue with waiting messages (``estafeta_brokers.queue_depth``) and no live worker
consuming it, a projection with no live projector. A process is live while its last beat is
within :data:`estafeta_sql.heartbeats.MISSED_BEATS` of its beat intervals on the service database's
clock; a process killed outright is stale after that, a cleanly stopped one is gone.

One service whose database (or whose queue on the broker) cannot be read loses only its
own lines, with the reason.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import dramatiq

from estafeta.observability.heartbeats import Kind
from estafeta_brokers.queue_depth import waiting_messages
from estafeta_sql import heartbeats, outbox_admin
from estafeta_sql.heartbeats import HeartbeatRow
from estafeta_sql.pool import Database

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.steps.spec import StepSpec


class ServedApp(Protocol):
    """What liveness needs of an app (an :class:`estafeta.App`): its services and its steps."""

    @property
    def services(self) -> list[Service]:
        """Every service of the app."""

    @property
    def steps(self) -> dict[str, StepSpec]:
        """Every step, by actor name."""


logger = logging.getLogger(__name__)


class Condition(enum.Enum):
    """Work that waits for a process that is not there."""

    OUTBOX_WITHOUT_RELAY = "outbox-without-relay"
    QUEUE_WITHOUT_CONSUMER = "queue-without-consumer"
    PROJECTION_WITHOUT_PROJECTOR = "projection-without-projector"


@attrs.frozen
class Unserved:
    """One outbox, queue or projection with nobody live to serve it."""

    condition: Condition
    service: str
    #: The outbox, queue or projection.
    subject: str
    #: Rows or messages waiting (``None`` for a projection: its lag is the projections page's).
    waiting: int | None

    def describe(self) -> str:
        """One line for an operator."""
        if self.condition is Condition.OUTBOX_WITHOUT_RELAY:
            return f"outbox {self.subject}: {self.waiting} pending row(s) and no live relay"
        if self.condition is Condition.QUEUE_WITHOUT_CONSUMER:
            return f"queue {self.subject}: {self.waiting} waiting message(s) and no live worker consuming it"
        return f"projection {self.service}.{self.subject}: no live projector"


@attrs.frozen
class ServiceSpec:
    """What a service offers to be served: its outbox (always), its queue (if it has steps), its projections."""

    name: str
    has_queue: bool
    projections: Sequence[str] = ()

    @classmethod
    def of_app(cls, app: ServedApp) -> list[ServiceSpec]:
        """The specs of every service of ``app``."""
        queues = {spec.queue_name for spec in app.steps.values()}
        return [cls(s.name, s.name in queues, [p.name for p in s.projections]) for s in app.services]


@attrs.frozen
class ServiceLiveness:
    """One service: its heartbeats and what waits in it."""

    service: str
    heartbeats: list[HeartbeatRow]
    #: Pending outbox rows (``None``: the database could not be read).
    outbox_pending: int | None
    #: Messages waiting on the service's queue (``None``: no queue, or the broker cannot tell).
    queue_waiting: int | None
    unserved: list[Unserved]
    #: Why something could not be read (the database, the broker), if it could not.
    error: str | None = None
    #: The service's projections.
    projections: tuple[str, ...] = ()

    def live(self, kind: Kind) -> list[HeartbeatRow]:
        """The live rows of ``kind``."""
        return [row for row in self.heartbeats if row.kind == kind.value and row.live]


@attrs.frozen
class Liveness:
    """Every service's heartbeats and unserved work."""

    services: list[ServiceLiveness]

    @property
    def unserved(self) -> list[Unserved]:
        """Every flagged condition, service by service."""
        return [u for s in self.services for u in s.unserved]

    @property
    def heartbeats(self) -> list[tuple[str, HeartbeatRow]]:
        """Every heartbeat row with its service."""
        return [(s.service, row) for s in self.services for row in s.heartbeats]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``str`` for times and ids): what ``estafeta status --json`` prints."""
        return {
            "services": [
                {
                    "service": s.service,
                    "outbox_pending": s.outbox_pending,
                    "queue_waiting": s.queue_waiting,
                    "error": s.error,
                    "heartbeats": [_row_dict(row) for row in s.heartbeats],
                    "unserved": [_unserved_dict(u) for u in s.unserved],
                }
                for s in self.services
            ],
            "unserved": [_unserved_dict(u) for u in self.unserved],
        }


def _row_dict(row: HeartbeatRow) -> dict[str, Any]:
    found = attrs.asdict(row)
    found.update(
        process_id=str(row.process_id),
        serves=list(row.serves),
        started_at=row.started_at.isoformat(),
        last_beat=row.last_beat.isoformat(),
        state="live" if row.live else "stale",
    )
    return found


def _unserved_dict(unserved: Unserved) -> dict[str, Any]:
    return {
        "condition": unserved.condition.value,
        "service": unserved.service,
        "subject": unserved.subject,
        "waiting": unserved.waiting,
        "message": unserved.describe(),
    }


def read_liveness(
    specs: Iterable[ServiceSpec], database_of: Callable[[str], Database], broker: dramatiq.Broker | None
) -> Liveness:
    """Each service's heartbeats, outbox backlog and queue backlog, and the conditions they raise."""
    return Liveness([read_service(spec, database_of(spec.name), broker) for spec in specs])


def read_service(spec: ServiceSpec, database: Database, broker: dramatiq.Broker | None) -> ServiceLiveness:
    """One service's :class:`ServiceLiveness`; what cannot be read is left out and said in ``error``."""
    errors = []
    try:
        with database.connection() as conn:
            rows = heartbeats.list_rows(conn, spec.name)
            pending: int | None = outbox_admin.stats(conn, spec.name).pending
    except Exception as exc:  # one database down costs its own service only
        rows, pending = [], None
        errors.append(f"database: {_first_line(exc)}")
    waiting = None
    if spec.has_queue and broker is not None:
        try:
            waiting = waiting_messages(broker, spec.name)
        except Exception as exc:  # the broker's own error type, whichever client it is
            errors.append(f"broker: {_first_line(exc)}")
    service = ServiceLiveness(spec.name, rows, pending, waiting, [], "; ".join(errors) or None, tuple(spec.projections))
    return attrs.evolve(service, unserved=_unserved(spec, service))


def _unserved(spec: ServiceSpec, service: ServiceLiveness) -> list[Unserved]:
    found: list[Unserved] = []
    if service.error and service.outbox_pending is None:
        return found  # nothing known of its heartbeats: flagging would guess
    if service.outbox_pending and not service.live(Kind.RELAY):
        found.append(Unserved(Condition.OUTBOX_WITHOUT_RELAY, spec.name, spec.name, service.outbox_pending))
    consumers = [row for row in service.live(Kind.WORKER) if spec.name in row.serves]
    if service.queue_waiting and not consumers:
        found.append(Unserved(Condition.QUEUE_WITHOUT_CONSUMER, spec.name, spec.name, service.queue_waiting))
    projecting = {name for row in service.live(Kind.PROJECTOR) for name in row.serves}
    found += [
        Unserved(Condition.PROJECTION_WITHOUT_PROJECTOR, spec.name, name, None)
        for name in spec.projections
        if name not in projecting
    ]
    return found


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def app_liveness(app: ServedApp, database_of: Callable[[str], Database], broker: dramatiq.Broker | None) -> Liveness:
    """:func:`read_liveness` of every service of ``app``."""
    return read_liveness(ServiceSpec.of_app(app), database_of, broker)


def live_users_of_queue(app: ServedApp, database_of: Callable[[str], Database], queue: str) -> list[HeartbeatRow]:
    """The live processes that could publish to or consume ``queue``, one row each, by kind, host and pid.

    Every live relay of ``app`` (a relay publishes the messages of every service it serves, to
    any queue) and every live worker consuming ``queue``, as the heartbeats of every service of
    ``app`` say. A database that cannot be read raises: nobody can tell who is live there.
    """
    found: dict[uuid.UUID, HeartbeatRow] = {}
    for service in app.services:
        with database_of(service.name).connection() as conn:
            rows = heartbeats.list_rows(conn, service.name)
        for row in rows:
            relay = row.kind == Kind.RELAY.value
            if row.live and (relay or (row.kind == Kind.WORKER.value and queue in row.serves)):
                found.setdefault(row.process_id, row)
    return sorted(found.values(), key=lambda row: (row.kind, row.host, row.pid))


def specs_from(services: Sequence[str], queues: Sequence[str], projections: dict[str, list[str]]) -> list[ServiceSpec]:
    """Specs from plain names (the worker metrics' manifest)."""
    return [ServiceSpec(name, name in queues, projections.get(name, ())) for name in services]
