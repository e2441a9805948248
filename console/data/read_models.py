"""The console's read models: projections and their lag, event streams, scheduled messages.

The same readings as ``estafeta projections status``, ``estafeta events show`` and
``estafeta outbox scheduled``, shaped for a page. A query string value the console cannot
use is a :class:`~estafeta_console.data.lists.BadFilter` naming the parameter, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from estafeta import App, Runtime, Service
from estafeta.events.projection_ops import ProjectionStatus, projection_status
from estafeta_sql import event_store, outbox_admin, projection_store
from estafeta_sql.event_store import StoredEvent
from estafeta_sql.outbox_admin import ScheduledRow

from .aggregates import aggregate_state
from .lists import BadFilter

#: Recent events read to name the streams written last (one index scan over positions).
RECENT_EVENTS = 200
#: Streams named on the browser's front.
RECENT_STREAMS = 20
#: Events of one stream shown at most (the CLI shows them all).
STREAM_EVENTS = 500
#: The longest stream id the browser takes.
_LONGEST_STREAM = 500
#: Scheduled messages read per service.
SCHEDULED = 200


@attrs.frozen
class ProjectionLine:
    """A projection of a service: its status, or ``None`` when no projector has run it yet."""

    service: str
    name: str
    status: ProjectionStatus | None

    @property
    def state(self) -> str:
        """``running``, ``stopped``, ``failed``, ``rebuilding``, or ``not started``."""
        return self.status.state if self.status else "not started"


@attrs.frozen
class ServerWriter:
    """The oldest open writing transaction of one PostgreSQL server, and the services it holds back."""

    services: list[str]
    writer: projection_store.OldestWriter


@attrs.frozen
class Projections:
    """Every projection of the app, and the oldest open writer of each server holding them back."""

    lines: list[ProjectionLine]
    writers: list[ServerWriter]


def event_services(app: App) -> list[Service]:
    """The app's services with an event store."""
    return [app.service(name) for name in app.service_names if app.service(name).event_store is not None]


def read_projections(app: App, runtime: Runtime) -> Projections:
    """Each declared projection (and any other checkpoint, a rebuild's) with its lag, one database at a time."""
    lines: list[ProjectionLine] = []
    servers: dict[str, tuple[list[str], projection_store.OldestWriter | None]] = {}
    for service in event_services(app):
        dsn = runtime.dsn_for(service.name)
        with runtime.database(service.name).connection() as conn:
            found = {status.name: status for status in projection_status(conn, service.name)}
            if dsn not in servers:
                servers[dsn] = ([], projection_store.oldest_writer(conn))
        servers[dsn][0].append(service.name)
        declared = [p.name for p in service.projections]
        names = declared + sorted(set(found) - set(declared))
        lines += [ProjectionLine(service.name, name, found.get(name)) for name in names]
    # Transaction ids are per server: a server's oldest writer holds back only the projections there.
    writers = [ServerWriter(names, writer) for names, writer in servers.values() if writer is not None]
    return Projections(lines, writers)


@attrs.frozen
class StreamQuery:
    """A stream as asked for: where, which, and as of when (a time or a version, not both)."""

    service: str
    stream: str
    as_of: datetime | None = None
    version: int | None = None


@attrs.frozen
class StreamPage:
    """The stream browser: the query, the streams written last, and the events asked for."""

    services: list[str]
    query: StreamQuery | None
    recent: list[tuple[str, StoredEvent]]
    events: list[StoredEvent]
    #: The events cut at :data:`STREAM_EVENTS`.
    truncated: bool = False
    #: The state the events make, when the service declares the stream's aggregate (as the CLI shows it).
    state: dict[str, Any] | None = None
    #: Why the state could not be built (an event that no longer decodes...).
    state_error: str | None = None


def parse_stream_query(app: App, params: Mapping[str, str]) -> StreamQuery | None:
    """The stream ``params`` ask for (``None``: no stream named); :class:`BadFilter` when a value is unusable."""
    services = [s.name for s in event_services(app)]
    stream = (params.get("stream") or "").strip()
    service = params.get("service") or (services[0] if len(services) == 1 else "")
    if not stream:
        return None
    if len(stream) > _LONGEST_STREAM:
        raise BadFilter(f"stream: longer than {_LONGEST_STREAM} characters")
    if service not in services:
        raise BadFilter(f"service: {service!r} has no event store (these do: {', '.join(services) or 'none'})")
    as_of, version = _moment(params.get("as_of", "")), _version(params.get("version", ""))
    if as_of is not None and version is not None:
        raise BadFilter("as_of and version: give one, not both")
    return StreamQuery(service, stream, as_of, version)


def _moment(text: str) -> datetime | None:
    if not text.strip():
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadFilter(f"as_of: {text!r} is not an ISO 8601 time (2026-11-30T12:00:00+00:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _version(text: str) -> int | None:
    if not text.strip():
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise BadFilter(f"version: {text!r} is not a version (a whole number from 1)")
    return int(text)


def read_streams(app: App, runtime: Runtime, query: StreamQuery | None) -> StreamPage:
    """The streams written last in each service, and the events of the stream asked for."""
    services = [s.name for s in event_services(app)]
    recent: list[tuple[str, StoredEvent]] = []
    for name in services:
        with runtime.database(name).connection() as conn:
            last = event_store.last_position(conn, name)
            tail = event_store.read_positions(conn, name, after=max(0, last - RECENT_EVENTS), limit=RECENT_EVENTS)
        latest: dict[str, StoredEvent] = {event.stream_id: event for event in tail}
        recent += [(name, event) for event in latest.values()]
    recent.sort(key=lambda item: item[1].recorded_at, reverse=True)
    if query is None:
        return StreamPage(services, None, recent[:RECENT_STREAMS], [])
    service = app.service(query.service)
    state, state_error = None, None
    with runtime.database(query.service).connection() as conn:
        events = event_store.read_stream(
            conn, query.service, query.stream, up_to_version=query.version, as_of=query.as_of
        )
        if events and service.event_store is not None:
            try:
                state = aggregate_state(conn, service, service.event_store, query.stream, query.version, query.as_of)
            except Exception as exc:  # one stream's bad event: shown on its page, the events still listed
                state_error = f"{type(exc).__name__}: {exc}"
    return StreamPage(
        services,
        query,
        recent[:RECENT_STREAMS],
        events[:STREAM_EVENTS],
        truncated=len(events) > STREAM_EVENTS,
        state=state,
        state_error=state_error,
    )


def read_scheduled(app: App, runtime: Runtime) -> list[dict[str, Any]]:
    """Messages sent for a time not here yet, every service's, soonest first (as ``estafeta outbox scheduled``)."""
    found: list[tuple[str, ScheduledRow]] = []
    for name in app.service_names:
        with runtime.database(name).connection() as conn:
            found += [(name, row) for row in outbox_admin.list_scheduled(conn, name, SCHEDULED)]
    found.sort(key=lambda item: item[1].available_at)
    return [{"service": name, **attrs.asdict(row)} for name, row in found]
