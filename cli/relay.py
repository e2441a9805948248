"""``estafeta relay``: drain every service's outbox into the broker."""

from __future__ import annotations

import logging
import signal
import threading

import click

from estafeta import build_relay
from estafeta.app.clock import warn_if_moved
from estafeta.messaging.relaying import close_relay, run_lanes
from estafeta.observability.heartbeats import relay_heartbeat

from .context import current
from .status import serve_liveness


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
    help=(
        "Batches in flight at once (each lane is a relay of its own, with its own connections): a lane "
        "publishes while another waits out a broker node's confirms; beside a healthy broker one lane "
        "measured as fast, at less CPU and latency."
    ),
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
    context = current()
    context.notice_as = "relay"
    runtime = context.runtime
    _check(runtime.settings.broker_url)
    names = context.services(services)
    options = {"batch_size": batch_size, "poll_interval": poll_interval, "confirm_timeout": confirm_timeout}
    relays = [build_relay(runtime, context.broker, names, **options) for _ in range(1 if once else lanes)]
    warn_if_moved(runtime, names, "relay")
    starting = _starting(names, runtime.settings.redacted_broker_url, len(relays), once)
    if runtime.settings.log_format == "json":  # every line on stderr is then a JSON object
        logging.getLogger("estafeta_cli.relay").warning(starting.removeprefix("estafeta: "))
    else:
        click.echo(starting, err=True)
    if metrics_port is not None:
        from estafeta_brokers import metrics

        metrics.serve(metrics_port, relays[0].outboxes, metrics_host)
        serve_liveness(context, relays[0].outboxes)
    try:
        if once:
            click.echo(f"published {relays[0].drain_once()}")
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        with relay_heartbeat(relays, runtime.settings.heartbeat_interval):
            run_lanes(relays, stop)
    finally:
        for relay in relays:
            close_relay(relay)


def _starting(outboxes: list[str], broker: str, lanes: int, once: bool) -> str:
    """The line the relay says at start: its outboxes, its broker (password masked), its lanes."""
    how = "once" if once else f"in {lanes} lane{'s' if lanes > 1 else ''}, until SIGTERM"
    return f"estafeta: relay publishing the outboxes of {', '.join(outboxes)} to {broker}, {how}"


def _check(broker_url: str) -> None:
    if broker_url.startswith("stub:"):
        raise click.UsageError(
            "ESTAFETA_BROKER_URL is stub://, which lives inside one process; "
            "set amqp://... or redis://... (or use `estafeta demo`)"
        )


COMMANDS = [relay_command]
