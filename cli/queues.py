"""``estafeta queues``: the app's queues and their consumers; RabbitMQ's redeclared when their arguments change."""

from __future__ import annotations

import json

import click

from .context import current


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
    refused before anything changes. Interrupted, it loses nothing; run it again to finish.
    """
    from estafeta_brokers.rabbitmq_queues import QueueTypedRabbitmqBroker
    from estafeta_brokers.rabbitmq_redeclare import Action, Redeclared, RedeclareRefused, redeclare_queues

    context = current()
    broker = context.broker
    if not isinstance(broker, QueueTypedRabbitmqBroker):
        raise click.UsageError(
            f"ESTAFETA_BROKER_URL is not a RabbitMQ URL ({context.runtime.settings.redacted_broker_url})"
        )
    parameters = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]

    def report(done: Redeclared) -> None:
        kept = f", {done.moved} message(s) kept" if done.moved or done.action is Action.REDECLARED else ""
        click.echo(f"{done.name}: {done.action.value} {broker.declarations.queue_type}{kept}")

    try:
        redeclare_queues(parameters, broker.declarations, broker.get_declared_queues(), report)
    except RedeclareRefused as exc:
        raise click.ClickException(str(exc)) from None


COMMANDS = [queues_group]
