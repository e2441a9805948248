"""``estafeta status``: which processes serve each service, and the work nobody live serves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from estafeta.observability.liveness import Liveness, ServiceSpec, app_liveness, read_liveness
from estafeta_sql.heartbeats import MISSED_BEATS, HeartbeatRow

from .context import AppContext, current
from .tables import table_lines, when

if TYPE_CHECKING:
    import dramatiq

    from estafeta_brokers.outboxes import Outbox

_HEADER = ("SERVICE", "KIND", "SERVES", "HOST", "PID", "VERSION", "STARTED", "LAST BEAT", "STATE")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: services, heartbeats, unserved work.")
def status_command(as_json: bool) -> None:
    """List the heartbeats of the workers, relays, projectors, schedulers and `serve` processes of every service.

    A process is live while it beat within its last three beat intervals
    (ESTAFETA_HEARTBEAT_INTERVAL, 5 s by default: stale 15 s after a SIGKILL); a cleanly
    stopped one is gone. Flagged in red: an outbox with pending rows and no live relay, a
    queue with waiting messages and no live worker consuming it, a projection with no live
    projector.
    """
    context = current()
    liveness = app_liveness(context.app, context.runtime.database, _broker(context))
    if as_json:
        click.echo(json.dumps(liveness.as_dict(), indent=2))
        return
    click.echo(render(liveness))


def _broker(context: AppContext) -> dramatiq.Broker | None:
    broker = context.broker
    return None if context.runtime.settings.broker_url.startswith("stub:") else broker


def render(liveness: Liveness) -> str:
    """The table of heartbeats (stale ones in red), then the backlog per service and what nobody serves."""
    rows = [_cells(service, row) for service, row in liveness.heartbeats]
    lines = table_lines(_HEADER, rows, red=[not row.live for _, row in liveness.heartbeats])
    if not rows:
        lines.append(click.style("no process has a heartbeat in any service", fg="red"))
    lines.append("")
    backlog = [(s.service, _count(s.outbox_pending), _count(s.queue_waiting), s.error or "") for s in liveness.services]
    lines += table_lines(("SERVICE", "OUTBOX PENDING", "QUEUE WAITING", "ERROR"), backlog)
    lines.append("")
    for unserved in liveness.unserved:
        lines.append(click.style(unserved.describe(), fg="red", bold=True))
    if not liveness.unserved:
        lines.append("every outbox, queue and projection with work has a live process")
    return "\n".join(lines)


def _count(value: int | None) -> int | str:
    return "?" if value is None else value


def _cells(service: str, row: HeartbeatRow) -> tuple[str, ...]:
    state = "live" if row.live else f"stale (missed {MISSED_BEATS}+ beats)"
    return (
        service, row.kind, ",".join(row.serves) or "-", row.host, str(row.pid), row.version,
        when(row.started_at), f"{row.age_seconds:.1f} s ago", state,
    )  # fmt: skip


def serve_liveness(context: AppContext, outboxes: Sequence[Outbox]) -> None:
    """Add the liveness gauges of ``outboxes``' services (and the app's queues) to this process's metrics."""
    from prometheus_client import REGISTRY

    from estafeta.observability.liveness_metrics import LivenessCollector

    databases = {outbox.schema: outbox.database for outbox in outboxes}
    specs = [spec for spec in ServiceSpec.of_app(context.app) if spec.name in databases]
    broker = _broker(context)
    REGISTRY.register(LivenessCollector(lambda: read_liveness(specs, databases.__getitem__, broker)))


COMMANDS = [status_command]
