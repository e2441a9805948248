"""``estafeta queues``: the app's queues and their consumers; RabbitMQ's redeclared when their arguments change."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .context import current

if TYPE_CHECKING:
    from estafeta.observability.liveness import ServedApp
    from estafeta_sql.pool import Database


@click.group("queues", invoke_without_command=True)
@click.pass_context
def queues_group(ctx: click.Context) -> None:
    """The app's queues: listed (alone, or ``list``), or redeclared on RabbitMQ."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


@queues_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the queues as JSON.")
def list_command(as_json: bool = False) -> None:
    """Each of the app's queues: the messages waiting on it and its consumers, asked of the broker.

    RabbitMQ counts each queue's consumers (one per worker process consuming it). Redis keeps
    no consumers per queue: the count is the Dramatiq processes active on the namespace in the
    last 10 s, on any queue, relays included. The StubBroker and Kafka cannot tell. A consumer
    of another deployment on these queues takes this deployment's messages (and parks them):
    see docs/how-to/run-for-real.md.
    """
    from estafeta_brokers.queue_consumers import queue_consumers
    from estafeta_brokers.queue_depth import waiting_messages

    context = current()
    broker = context.broker
    try:
        rows = [
            (name, waiting_messages(broker, name), queue_consumers(broker, name))
            for name in sorted({spec.queue_name for spec in context.app.steps.values()})
        ]
    except Exception as exc:
        where = context.runtime.settings.redacted_broker_url
        raise click.ClickException(f"cannot ask {where} about its queues: {type(exc).__name__}: {exc}") from None
    if as_json:
        shown = [
            {"queue": name, "waiting": waiting, "consumers": consumers.count, "counted": consumers.counted.value}
            for name, waiting, consumers in rows
        ]
        click.echo(json.dumps({"queues": shown}))
        return
    click.echo(f"{'queue':<24} {'waiting':>8}  consumers")
    for name, waiting, consumers in rows:
        click.echo(f"{name:<24} {'unknown' if waiting is None else waiting:>8}  {consumers.describe()}")


@queues_group.command("redeclare")
def redeclare_command() -> None:
    """Redeclare the app's queues as ESTAFETA_RABBITMQ_QUEUE_TYPE says, keeping their messages.

    For each queue Q of the app, and its Q.DQ and Q.XQ: a queue RabbitMQ holds with other
    arguments (classic where quorum is configured, another ESTAFETA_MAX_DELIVERIES...) is
    emptied into a holding queue Q.redeclaring, deleted, declared again and refilled; the
    others are left alone. Stop every worker and relay first: a queue with a consumer is
    refused before anything changes, and so is a quorum queue while the heartbeats show a live
    relay of the app or a live worker of the queue (exit code 2). Interrupted, it loses
    nothing; run it again to finish.
    """
    from estafeta_brokers.rabbitmq_queues import QueueTypedRabbitmqBroker
    from estafeta_brokers.rabbitmq_redeclare import Action, QueueInUse, Redeclared, RedeclareRefused, redeclare_queues

    context = current()
    broker = context.broker
    if not isinstance(broker, QueueTypedRabbitmqBroker):
        raise click.UsageError(
            f"ESTAFETA_BROKER_URL is not a RabbitMQ URL ({context.runtime.settings.redacted_broker_url})"
        )
    parameters = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # Each probe (a queue not there yet, a queue with other arguments) closes a channel by
        # design: pika's warning for each would bury the command's own lines (-vv shows them).
        logging.getLogger("pika.channel").setLevel(logging.ERROR)

    def report(done: Redeclared) -> None:
        kept = f", {done.moved} message(s) kept" if done.moved or done.action is Action.REDECLARED else ""
        click.echo(f"{done.name}: {done.action.value} {broker.declarations.queue_type}{kept}")

    users = functools.partial(_live_users, context.app, context.runtime.database)
    try:
        redeclare_queues(parameters, broker.declarations, broker.get_declared_queues(), report, users)
    except QueueInUse as exc:
        raise StopThemFirst(str(exc)) from None
    except RedeclareRefused as exc:
        raise click.ClickException(str(exc)) from None


def _live_users(app: ServedApp, database_of: Callable[[str], Database], queue: str) -> list[str]:
    """Who could publish to or consume ``queue`` as the heartbeats say (``relay on HOST pid PID``)."""
    from estafeta.observability.liveness import live_users_of_queue
    from estafeta_brokers.rabbitmq_redeclare import RedeclareRefused

    try:
        rows = live_users_of_queue(app, database_of, queue)
    except Exception as exc:  # whichever database error: nobody can tell who is live
        first = (str(exc).strip().splitlines() or [""])[0]
        raise RedeclareRefused(
            f"cannot read the heartbeats to tell who could publish to quorum queue {queue!r}:"
            f" {type(exc).__name__}: {first}; the queue was left as it is"
        ) from None
    return [f"{row.kind} on {row.host} pid {row.pid}" for row in rows]


class StopThemFirst(click.ClickException):
    """Refused until the processes named are stopped: exit code 2, like bad input (nothing to retry as is)."""

    exit_code = 2


COMMANDS = [queues_group]
