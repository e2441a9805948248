"""``estafeta queues``: the app's RabbitMQ queues, redeclared when their type or arguments change."""

from __future__ import annotations

import click

from .context import current


@click.group("queues")
def queues_group() -> None:
    """The app's RabbitMQ queues."""


@queues_group.command("redeclare")
def redeclare_command() -> None:
    """Redeclare the app's queues as ESTAFETA_RABBITMQ_QUEUE_TYPE says, keeping their messages.

    For each queue Q of the app, and its Q.DQ and Q.XQ: a queue RabbitMQ holds with other
    arguments (classic where quorum is configured, another ESTAFETA_MAX_DELIVERIES...) is
    emptied into a holding queue Q.redeclaring, deleted, declared again and refilled; the
    others are left alone. Stop every worker and relay first: a queue with a consumer is
    refused before anything changes. Interrupted, it loses nothing; run it again to finish.
    """
    from brokers.rabbitmq_queues import QueueTypedRabbitmqBroker
    from brokers.rabbitmq_redeclare import Action, Redeclared, RedeclareRefused, redeclare_queues

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
