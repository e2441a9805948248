"""``estafeta relay``: drain every service's outbox into the broker."""

from __future__ import annotations

import signal
import threading
from datetime import timedelta
from typing import Any

import click
import dramatiq

from brokers.publish import publisher_for
from brokers.relay import Outbox, Relay, RelayConfig


def build_relay(runtime: Any, broker: dramatiq.Broker, services: list[str], **overrides: Any) -> Relay:
    """A relay over ``services``' outboxes (all services when empty), configured from settings."""
    from actors.services import all_services

    settings = runtime.settings
    names = services or [s.name for s in all_services()]
    config = RelayConfig(
        batch_size=overrides.get("batch_size") or settings.relay_batch_size,
        poll_interval=overrides.get("poll_interval") or settings.relay_poll_interval,
        max_attempts=settings.relay_max_attempts,
        attempt_backoff=overrides.get("attempt_backoff") or timedelta(seconds=1),
    )
    outboxes = [Outbox(name, runtime.database(name)) for name in names]
    return Relay(outboxes, publisher_for(broker), config)


@click.command("relay")
@click.option("--once", is_flag=True, help="Publish what is due now, then exit.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Rows per batch [ESTAFETA_RELAY_BATCH_SIZE].")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    help="Seconds between polls [ESTAFETA_RELAY_POLL_INTERVAL].",
)
@click.option("--service", "services", multiple=True, help="Only this service's outbox (repeatable).")
def relay_command(once: bool, batch_size: int | None, poll_interval: float | None, services: tuple[str, ...]) -> None:
    """Publish committed outbox rows to the broker, deleting each once the broker confirmed it.

    Runs until SIGTERM or Ctrl-C (finishing the batch in hand). Run it as its own
    process, never inside a Dramatiq worker.
    """
    from actors import broker, runtime, settings
    from actors.services import all_services

    if settings.broker_url.startswith("stub:"):
        raise click.UsageError(
            "ESTAFETA_BROKER_URL is stub://, which lives inside one process; "
            "set amqp://... or redis://... (or use `estafeta demo`)"
        )
    known = {s.name for s in all_services()}
    unknown = [name for name in services if name not in known]
    if unknown:
        raise click.BadParameter(f"no service {unknown[0]!r}", param_hint="--service")
    relay = build_relay(runtime, broker, list(services), batch_size=batch_size, poll_interval=poll_interval)
    if once:
        published = relay.drain_once()
        relay.publisher.close()
        click.echo(f"published {published}")
        return
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    relay.run(stop)


COMMANDS = [relay_command]
