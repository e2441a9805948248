"""``estafeta projections`` (run, status, rebuild) and ``estafeta events show``: the event store on the command line."""

from __future__ import annotations

import json
import signal
import threading
from datetime import UTC, datetime
from typing import Any

import attrs
import click
from prometheus_client import start_http_server

from estafeta import EventStore, Projection, Projector, Service, run_projectors
from estafeta.app.clock import warn_if_moved
from estafeta.events.projection_ops import projection_status, rebuild
from estafeta.observability.heartbeats import Kind, app_heartbeat
from estafeta_console.data.aggregates import aggregate_state
from estafeta_sql import projection_store

from .context import current
from .tables import echo_table, when

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_service_option = click.option(
    "--service", "services", multiple=True, help="Only this service (repeatable; default: every one with events)."
)


def _event_services(names: tuple[str, ...] = ()) -> list[Service]:
    """The app's services with an event store (those named, checked)."""
    app = current().app
    chosen = [app.service(name) for name in current().services(names)]
    with_events = [s for s in chosen if s.event_store is not None]
    if names and len(with_events) < len(chosen):
        missing = next(s.name for s in chosen if s.event_store is None)
        raise click.BadParameter(f"service {missing!r} has no event store", param_hint="--service")
    if not with_events:
        raise click.UsageError(f"no service of app {app.name} has an event store (Service.use_events)")
    return with_events


def _store(service: Service) -> EventStore:
    assert service.event_store is not None
    return service.event_store


@click.group("projections")
def projections_group() -> None:
    """Run, inspect and rebuild the read models built from the event store."""


@projections_group.command("run")
@_service_option
@click.option("--projection", "names", multiple=True, help="Only this projection (repeatable).")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=500, show_default=True, help="Events applied per transaction."
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds between looks for new events when no NOTIFY wakes a projector.",
)
@click.option("--metrics-port", type=click.IntRange(min=1, max=65535), help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Address the metrics server listens on.")
def run_command(
    services: tuple[str, ...],
    names: tuple[str, ...],
    batch_size: int,
    poll_interval: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Tail the event log into every projection until SIGTERM; one projector per projection at a time.

    A second `projections run` waits as a standby for each projection and takes over when
    the first one stops. Exits 1 if a projection stopped on a bad event (`status` says which).
    """
    runtime = current().runtime
    chosen = [(s, p) for s in _event_services(services) for p in s.projections if not names or p.name in names]
    unknown = set(names) - {p.name for _, p in chosen}
    if unknown or not chosen:
        missing = sorted(unknown)[0] if unknown else ""
        raise click.BadParameter(f"no projection {missing!r} to run", param_hint="--projection")
    warn_if_moved(runtime, sorted({service.name for service, _ in chosen}), "projections")
    if metrics_port:
        start_http_server(metrics_port, addr=metrics_host)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    by_dsn: dict[str, list[Projector]] = {}
    for service, projection in chosen:
        projector = Projector(projection, _store(service), batch_size=batch_size)
        by_dsn.setdefault(runtime.dsn_for(service.name), []).append(projector)
    serving: dict[str, list[str]] = {}
    for service, projection in chosen:
        serving.setdefault(service.name, []).append(projection.name)
    with app_heartbeat(Kind.PROJECTOR, serving, runtime, len(chosen)):
        outcomes = _run_all(by_dsn, stop, poll_interval)
    failed = sorted(name for name, outcome in outcomes.items() if outcome != "stopped")
    if failed:
        raise click.ClickException(f"projection(s) stopped: {', '.join(failed)}; see `estafeta projections status`")


def _run_all(by_dsn: dict[str, list[Projector]], stop: threading.Event, poll_interval: float) -> dict[str, str]:
    outcomes: dict[str, str] = {}

    def serve(dsn: str, projectors: list[Projector]) -> None:
        outcomes.update(run_projectors(dsn, projectors, stop, poll_interval=poll_interval))

    threads = [threading.Thread(target=serve, args=item) for item in by_dsn.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)
    return outcomes


@projections_group.command("status")
@_service_option
@_json_option
def status_command(services: tuple[str, ...], as_json: bool) -> None:
    """Each projection's position, lag (events and seconds) and state, and the oldest open writer."""
    runtime = current().runtime
    found: list[dict[str, Any]] = []
    # Transaction ids are per server: each server's oldest writer holds back only the
    # projections on that server (services sharing a DSN share one).
    servers: dict[str, tuple[list[str], projection_store.OldestWriter | None]] = {}
    for service in _event_services(services):
        dsn = runtime.dsn_for(service.name)
        with runtime.database(service.name).connection() as conn:
            for status in projection_status(conn, service.name):
                found.append({"service": service.name, **attrs.asdict(status)})
            if dsn not in servers:
                servers[dsn] = ([], projection_store.oldest_writer(conn))
        servers[dsn][0].append(service.name)
    writers = [(names, writer) for names, writer in servers.values() if writer is not None]
    if as_json:
        each = [{"services": names, **attrs.asdict(writer)} for names, writer in writers]
        oldest = max(each, key=lambda w: w["age_seconds"], default=None)
        click.echo(json.dumps({"projections": found, "oldest_writer": oldest, "oldest_writers": each}, default=str))
        return
    echo_table(
        ("PROJECTION", "STATE", "POSITION", "LAG (EVENTS)", "LAG (S)", "ERROR"),
        [
            (f"{r['service']}.{r['name']}", r["state"], r["position"], r["lag_events"], r["lag_seconds"], _error(r))
            for r in found
        ],
        empty="no projection has run yet",
    )
    if writers:
        click.echo()
    for names, writer in writers:
        click.echo(
            f"oldest open writing transaction on the server of {', '.join(names)}: pid {writer.pid}"
            f" ({writer.database}, {writer.application_name or '-'}, {writer.state}), open {writer.age_seconds:.1f}s:"
            " every projection there waits for it"
        )


def _error(row: dict[str, Any]) -> str | None:
    if not row["last_error"]:
        return None
    where = f"at {row['error_position']}: " if row["error_position"] is not None else ""
    return f"{where}{row['last_error']}"


@projections_group.command("rebuild")
@click.argument("name")
@_service_option
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=1000, show_default=True, help="Events applied per transaction."
)
def rebuild_command(name: str, services: tuple[str, ...], batch_size: int) -> None:
    """Rebuild projection NAME side by side while the old one keeps answering, then switch over.

    Refuses, naming them, while views or other tables' foreign keys depend on its tables
    (the switch-over replaces the tables): drop them, rebuild, create them again.
    """
    runtime = current().runtime
    matches = [(s, p) for s in _event_services(services) for p in s.projections if p.name == name]
    if len(matches) != 1:
        raise click.BadParameter(f"{len(matches)} projections named {name!r} (use --service)", param_hint="NAME")
    service, projection = matches[0]
    result = _rebuild_with_bar(runtime.dsn_for(service.name), projection, _store(service), batch_size)
    applied, seconds = result.events_applied, result.seconds
    click.echo(f"{service.name}.{name}: rebuilt from {applied} events in {seconds:.1f}s; switched over")


def _rebuild_with_bar(dsn: str, projection: Projection, store: EventStore, batch_size: int) -> Any:
    with click.progressbar(length=1, label=f"rebuilding {projection.name}", show_pos=True) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = total
            bar.update(done - bar.pos)

        return rebuild(dsn, projection, store, batch_size=batch_size, progress=progress)


class Moment(click.ParamType):  # type: ignore[type-arg]
    """An ISO 8601 time (UTC when it has no offset); anything else is a one-line usage error."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time (2026-11-30T12:00:00+00:00)", param, ctx)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@click.group("events")
def events_group() -> None:
    """Look into the event store."""


@events_group.command("show")
@click.argument("stream_id")
@click.option("--service", "service_name", help="The service whose store holds it (default: the only one).")
@click.option("--as-of", "as_of", type=Moment(), help="As it was at this time (ISO 8601; UTC when no offset).")
@click.option("--version", type=click.IntRange(min=1), help="As it was after this many events.")
@_json_option
def show_command(
    stream_id: str, service_name: str | None, as_of: datetime | None, version: int | None, as_json: bool
) -> None:
    """Print a stream's events (as of a time or a version) and the state they make, if its aggregate is known."""
    if as_of is not None and version is not None:
        raise click.UsageError("give --as-of or --version, not both")
    service = _one_service(service_name)
    store = _store(service)
    with current().runtime.database(service.name).connection() as conn:
        events = store.read(conn, stream_id, up_to_version=version, as_of=as_of)
        if not events:
            reason = f"stream {stream_id!r} has no event in {service.name} at that point"
            raise click.BadParameter(reason, param_hint="STREAM")
        state = aggregate_state(conn, service, store, stream_id, version, as_of)
    rows = [
        {
            "version": e.version,
            "position": e.position,
            "type": e.type,
            "recorded_at": e.recorded_at.isoformat(),
            "data": json.loads(json.dumps(attrs.asdict(e.event), default=str)),
        }
        for e in events
    ]
    if as_json:
        click.echo(json.dumps({"stream": stream_id, "events": rows, "state": state}, default=str))
        return
    echo_table(
        ("VERSION", "POSITION", "RECORDED", "TYPE", "DATA"),
        [
            (e.version, e.position, when(e.recorded_at, precise=True), e.type, json.dumps(r["data"]))
            for e, r in zip(events, rows, strict=True)
        ],
        empty="no events",
    )
    if state is not None:
        click.echo(f"state: {json.dumps(state, default=str)}")


def _one_service(name: str | None) -> Service:
    services = _event_services((name,) if name else ())
    if len(services) > 1:
        raise click.BadParameter("several services have an event store: name one", param_hint="--service")
    return services[0]


COMMANDS = [projections_group, events_group]
