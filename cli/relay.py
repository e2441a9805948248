"""``estafeta relay``: drain every service's outbox into the broker."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from typing import Any

import click
import dramatiq
from psycopg import conninfo

from brokers.publish import publisher_for
from brokers.relay import Outbox, Relay, RelayConfig
from sql.pool import Database

#: ``application_name`` of the relay's pooled connections (``pg_stat_activity``).
APPLICATION_NAME = "estafeta-relay"


def build_relay(runtime: Any, broker: dramatiq.Broker, services: list[str], **overrides: Any) -> Relay:
    """A relay over ``services``' outboxes (all services when empty), configured from settings.

    The relay gets pools of its own, named ``estafeta-relay`` in ``pg_stat_activity``,
    one per database (services sharing a database share it).
    """
    from actors.services import all_services

    settings = runtime.settings
    names = services or [s.name for s in all_services()]
    config = RelayConfig(
        batch_size=overrides.get("batch_size") or settings.relay_batch_size,
        poll_interval=overrides.get("poll_interval") or settings.relay_poll_interval,
        max_attempts=settings.relay_max_attempts,
        attempt_backoff=overrides.get("attempt_backoff") or timedelta(seconds=1),
    )
    databases: dict[str, Database] = {}
    outboxes = []
    for name in names:
        dsn = runtime.dsn_for(name)
        if dsn not in databases:
            named = conninfo.make_conninfo(dsn, application_name=APPLICATION_NAME)
            databases[dsn] = Database(named, min_size=1, max_size=2)
        outboxes.append(Outbox(name, databases[dsn]))
    options = {"confirm_timeout": overrides["confirm_timeout"]} if overrides.get("confirm_timeout") else {}
    return Relay(outboxes, publisher_for(broker, **options), config)


def close_relay(relay: Relay) -> None:
    """Close the relay's broker connection and database pools."""
    relay.publisher.close()
    for database in {id(o.database): o.database for o in relay.outboxes}.values():
        database.close()


@click.command("relay")
@click.option("--once", is_flag=True, help="Publish what is due now, then exit.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Rows per batch [ESTAFETA_RELAY_BATCH_SIZE].")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    help="Seconds between polls when no NOTIFY arrives [ESTAFETA_RELAY_POLL_INTERVAL].",
)
@click.option(
    "--confirm-timeout",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="Seconds to wait for the broker to confirm a batch before treating it as unreachable.",
)
@click.option(
    "--lanes",
    type=click.IntRange(min=1, max=16),
    default=2,
    show_default=True,
    help="Batches in flight at once (each lane is a relay of its own, with its own connections).",
)
@click.option("--service", "services", multiple=True, help="Only this service's outbox (repeatable).")
@click.option("--metrics-port", type=click.IntRange(min=1, max=65535), help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Address the metrics server listens on.")
def relay_command(
    once: bool,
    batch_size: int | None,
    poll_interval: float | None,
    confirm_timeout: float,
    lanes: int,
    services: tuple[str, ...],
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Publish committed outbox rows to the broker, deleting each once the broker confirmed it.

    Runs until SIGTERM or Ctrl-C (finishing the batch in hand; its unconfirmed rows stay
    pending). Several relays may run at once: per-key order holds across them. Run it
    as its own process, never inside a Dramatiq worker.
    """
    from actors import broker, runtime, settings

    _check(settings.broker_url, services)
    # pika logs every timer at debug level; one line per batch is the relay's own job.
    logging.getLogger("pika").setLevel(max(logging.getLogger().level, logging.WARNING))
    options = {"batch_size": batch_size, "poll_interval": poll_interval, "confirm_timeout": confirm_timeout}
    relays = [build_relay(runtime, broker, list(services), **options) for _ in range(1 if once else lanes)]
    if metrics_port is not None:
        from brokers import metrics

        metrics.serve(metrics_port, relays[0].outboxes, metrics_host)
    try:
        if once:
            click.echo(f"published {relays[0].drain_once()}")
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        run_lanes(relays, stop)
    finally:
        for relay in relays:
            close_relay(relay)


def _check(broker_url: str, services: tuple[str, ...]) -> None:
    from actors.services import all_services

    if broker_url.startswith("stub:"):
        raise click.UsageError(
            "ESTAFETA_BROKER_URL is stub://, which lives inside one process; "
            "set amqp://... or redis://... (or use `estafeta demo`)"
        )
    known = {s.name for s in all_services()}
    unknown = [name for name in services if name not in known]
    if unknown:
        raise click.BadParameter(f"no service {unknown[0]!r}", param_hint="--service")


def run_lanes(relays: list[Relay], stop: threading.Event) -> None:
    """Run ``relays`` side by side until ``stop``; a lane that crashes stops them all, and is re-raised.

    Each lane claims its own batches, so one lane's database round trips overlap the
    other's wait for broker confirms; per-key order holds across lanes as it does
    across relay processes.
    """
    errors: list[BaseException] = []

    def lane(relay: Relay) -> None:
        try:
            relay.run(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=lane, args=(r,), name=f"estafeta-relay-lane-{i}") for i, r in enumerate(relays)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # short joins: the main thread must stay free for signal handlers
    if errors:
        raise errors[0]


COMMANDS = [relay_command]
