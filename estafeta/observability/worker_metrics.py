"""Prometheus metrics of ``dramatiq`` worker processes: one port per ``dramatiq`` command.

A ``dramatiq`` command runs several worker processes and Prometheus scrapes one address.
With ``ESTAFETA_METRICS_PORT`` set, every worker process writes its counters and
histograms (steps, locks, sagas) to prometheus_client's multiprocess files, in a
directory of the command's own; one more process, a Dramatiq *fork* started once the
workers are up, serves their sum on the port, with the gauges read from the tables at
scrape time (outboxes, sagas by status, stuck sagas, dead letters).

The directory is ``$PROMETHEUS_MULTIPROC_DIR`` if the operator set it (wiping it between
runs is then theirs to do, as prometheus_client documents), else
``<tmp>/estafeta-metrics-<pid>-<start time>`` of the ``dramatiq`` command: a new one per
run, so no run sums another's counters; each fork removes those of commands that no longer
run when it starts.

prometheus_client picks its storage when a metric's first labelled child is made, not at
import: :func:`use_multiprocess` switches it at worker boot, before any message is
processed. Metrics an application makes at import *without* labels stay in that one
process; make them after ``bind()``, or set ``PROMETHEUS_MULTIPROC_DIR`` before starting
``dramatiq``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import dramatiq
from psycopg import conninfo

from estafeta.app.runtime import Runtime
from estafeta.app.settings import Settings
from estafeta.observability import logs as logs
from estafeta.observability.liveness import ServiceSpec
from estafeta.observability.liveness_metrics import manifest_collector
from estafeta.observability.table_metrics import SagaKind, TablesCollector
from estafeta_brokers.metrics import ClockCollector, OutboxCollector
from estafeta_brokers.outboxes import Outbox
from estafeta_sql.pool import Database
from estafeta_sql.sagas import SagaTable

if TYPE_CHECKING:
    from estafeta.sagas.saga import Saga

logger = logging.getLogger(__name__)

#: Environment variable naming prometheus_client's multiprocess directory.
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
#: Prefix of the per-run directories estafeta makes (the suffix is the dramatiq command's pid).
RUN_PREFIX = "estafeta-metrics-"
#: The file in the directory that tells the fork which services and sagas to read.
MANIFEST = "estafeta-tables.json"
#: ``application_name`` of the metrics server's connections (``pg_stat_activity``).
APPLICATION_NAME = "estafeta-metrics"


def metrics_directory(command_pid: int) -> Path:
    """Where the worker processes of the ``dramatiq`` command ``command_pid`` write their metrics."""
    chosen = os.environ.get(MULTIPROC_VARIABLE)
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / f"{RUN_PREFIX}{command_id(command_pid)}"


def command_id(pid: int) -> str:
    """``pid`` and its start time: a later process that gets the same pid gets another id."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return str(pid)
    # Field 22 is the start time; the fields after the ")" closing the name start at field 3.
    return f"{pid}-{stat.rsplit(')', 1)[1].split()[19]}"


def use_multiprocess(directory: Path) -> None:
    """Make this process's metrics go to ``directory``, for the fork to sum with its siblings'."""
    from prometheus_client import values

    directory.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_VARIABLE] = str(directory)
    # Children made from now on use the multiprocess storage (labelled metrics make theirs on first use).
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


class WorkerMetrics(dramatiq.Middleware):
    """Puts a ``dramatiq`` command's worker metrics on ``ESTAFETA_METRICS_PORT`` (see the module's docstring)."""

    def __init__(self, services: Sequence[str], sagas: Sequence[Saga], specs: Sequence[ServiceSpec] = ()) -> None:
        self.manifest = {
            "services": list(services),
            "liveness": [attrs.asdict(spec) for spec in specs],
            "sagas": [{"name": saga.name, "table": attrs.asdict(saga.table)} for saga in sagas],
        }
        self.directory: Path | None = None

    @property
    def forks(self) -> list[Any]:
        return [serve_worker_metrics]

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        # Worker processes are children of the dramatiq command, and so is the fork.
        self.directory = metrics_directory(os.getppid())
        use_multiprocess(self.directory)
        temporary = self.directory / f".{MANIFEST}.{os.getpid()}"
        temporary.write_text(json.dumps(self.manifest), encoding="utf-8")
        temporary.replace(self.directory / MANIFEST)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        if self.directory is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), str(self.directory))  # type: ignore[no-untyped-call]


def serve_worker_metrics() -> int:
    """The Dramatiq fork: serve the worker processes' metrics and the table gauges until SIGTERM."""
    from prometheus_client import start_http_server

    settings = Settings.from_env()
    logs.adopt_handlers(settings.log_format)
    directory = metrics_directory(os.getppid())
    if directory.name.startswith(RUN_PREFIX):
        # Not removed at exit (a worker may still write while the command stops): at the next start.
        sweep(directory.parent)
    registry, outboxes = _registry(settings, directory)
    assert settings.metrics_port is not None
    try:
        start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
    except OSError as exc:
        logger.error("estafeta: cannot serve worker metrics on port %s: %s", settings.metrics_port, exc)
        return 1
    logger.info("worker metrics on %s:%s (%s)", settings.metrics_host, settings.metrics_port, directory)
    try:
        threading.Event().wait()  # until SIGTERM, whose handler raises SystemExit here
    finally:
        for database in {id(o.database): o.database for o in outboxes}.values():
            database.close()
    return 0


def _registry(settings: Settings, directory: Path) -> tuple[Any, list[Outbox]]:
    """The worker processes' metrics summed, and the gauges of the tables the manifest names."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    manifest_path = directory / MANIFEST
    for _ in range(300):  # the workers write it at boot; the fork may start first after a slow boot
        if manifest_path.exists():
            break
        time.sleep(0.1)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    outboxes, kinds = _tables(Runtime(settings), manifest)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    registry.register(OutboxCollector(outboxes))
    registry.register(ClockCollector(outboxes))
    registry.register(TablesCollector(outboxes, kinds, settings.saga_stuck_after))
    registry.register(manifest_collector(settings, manifest.get("liveness", []), outboxes))
    return registry, outboxes


def _tables(runtime: Runtime, manifest: dict[str, Any]) -> tuple[list[Outbox], list[SagaKind]]:
    databases: dict[str, Database] = {}

    def database(service: str) -> Database:
        dsn = runtime.dsn_for(service)
        if dsn not in databases:
            named = conninfo.make_conninfo(dsn, application_name=APPLICATION_NAME)
            databases[dsn] = Database(named, min_size=1, max_size=2)
        return databases[dsn]

    outboxes = [Outbox(name, database(name)) for name in manifest["services"]]
    kinds = [
        SagaKind(saga["name"], SagaTable(**saga["table"]), database(saga["table"]["schema"]))
        for saga in manifest["sagas"]
    ]
    return outboxes, kinds


def sweep(base: Path) -> list[Path]:
    """Remove the metrics directories of ``dramatiq`` commands that no longer run; return them."""
    removed = []
    for path in base.glob(f"{RUN_PREFIX}*"):
        found = path.name.removeprefix(RUN_PREFIX)
        pid = found.split("-", 1)[0]
        if pid.isdigit() and not _runs(int(pid), found):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _runs(pid: int, found: str) -> bool:
    """Whether the command whose id is ``found`` still runs (and is not another process with its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it runs
    return command_id(pid) == found
