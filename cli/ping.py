"""``estafeta ping``: one message round trip through outbox, relay, broker, worker and inbox."""

from __future__ import annotations

import contextlib
import time

import click


@click.command("ping")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds to wait.")
def ping_command(timeout: float) -> None:
    """Send a ping and wait for its pong: proves relay, broker and workers are wired.

    With the StubBroker (the default) a worker and a relay run inside this command;
    otherwise `dramatiq actors` and `estafeta relay` must be running.
    """
    from actors import broker, pingpong, runtime, settings

    runtime.migrate(["pingpong"])
    database = runtime.database("pingpong")
    harness: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if settings.broker_url.startswith("stub:"):
        from .inprocess import running

        harness = running(runtime, broker)
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
        f"no pong for {ping_id} within {timeout:g} s: are `dramatiq actors` and `estafeta relay` running?"
    )


COMMANDS = [ping_command]
