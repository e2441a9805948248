"""The front page's "Processes" section: heartbeats per service, and what nobody live serves.

Read from the services' databases only, as the rest of the console: the queues' backlogs
are the broker's (``estafeta status`` and the metrics read them), so here a service whose
queue has no live worker is shown in red whatever waits on it.
"""

from __future__ import annotations

import attrs

from estafeta import App, Runtime
from estafeta.observability.heartbeats import Kind
from estafeta.observability.liveness import Liveness, ServiceLiveness, ServiceSpec, read_liveness


@attrs.frozen
class ServiceLine:
    """One service on the front page: its live processes by kind, and what is missing."""

    service: ServiceLiveness
    #: Live relays, workers and projectors.
    relays: int
    workers: int
    projectors: int
    #: Missing processes, said for an operator ("no live relay, 3 rows pending").
    missing: list[str]


def read_processes(app: App, runtime: Runtime) -> tuple[Liveness, list[ServiceLine]]:
    """Every heartbeat of ``app``'s services, and one line per service."""
    specs = ServiceSpec.of_app(app)
    liveness = read_liveness(specs, runtime.database, None)
    return liveness, [_line(spec, service) for spec, service in zip(specs, liveness.services, strict=True)]


def _line(spec: ServiceSpec, service: ServiceLiveness) -> ServiceLine:
    relays, workers = len(service.live(Kind.RELAY)), len(service.live(Kind.WORKER))
    missing = [u.describe() for u in service.unserved]
    if not relays and not service.outbox_pending and service.error is None:
        missing.append("no live relay (nothing pending now)")
    if spec.has_queue and not workers and service.error is None:
        missing.append(f"queue {spec.name}: no live worker consuming it")
    return ServiceLine(service, relays, workers, len(service.live(Kind.PROJECTOR)), missing)
