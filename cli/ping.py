"""``estafeta ping``: one message round trip through outbox, relay, broker, worker and inbox."""

from __future__ import annotations

import contextlib
import time

import click

from .context import order_system
from .migrated import require_migrated


@click.command("ping")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds to wait.")
def ping_command(timeout: float) -> None:
    """Send a ping and wait for its pong: proves relay, broker and workers are wired.

    \b
    A pong proves, on the pingpong service's database and queue, twice over (the
    ping, then its pong):
    - a command committed to the outbox in the transaction that wrote it,
    - a relay published it and the broker delivered it,
    - a worker consuming the pingpong queue ran its step, the inbox record, the
      effect and the next command in one transaction,
    - and the effect took once ("effects: 1"; 2 would be a duplicate run).
    It proves nothing of the other services' queues (a worker may consume only
    some: --queues), databases or outboxes: `estafeta outbox stats` and `estafeta
    queues` show those.

    With the StubBroker (the default) a worker and a relay run inside this command;
    otherwise `dramatiq estafeta_actors` and `estafeta relay` must be running.
    """
    context = order_system()
    from estafeta import running
    from estafeta_actors import pingpong

    runtime = context.runtime
    runtime.migrate([pingpong.SERVICE])
    database = runtime.database("pingpong")
    harness: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if runtime.settings.broker_url.startswith("stub:"):
        require_migrated(context)  # the relay run here drains every service's outbox
        harness = running(context.binding)
    with harness:
        started = time.monotonic()
        with database.transaction() as conn:
            ping_id = pingpong.send_ping(conn)
        while time.monotonic() - started < timeout:
            with database.connection() as conn:
                answered, pongs = pingpong.ping_status(conn, ping_id)
            if answered:
                click.echo(f"pong {ping_id} in {(time.monotonic() - started) * 1000:.0f} ms (effects: {pongs})")
                return
            time.sleep(0.02)
    raise click.ClickException(
        f"no pong for {ping_id} within {timeout:g} s: are `dramatiq estafeta_actors` and `estafeta relay` running?"
    )


COMMANDS = [ping_command]
