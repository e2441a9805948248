"""Redeclaring RabbitMQ queues with other arguments (classic to quorum, or back), keeping their messages.

RabbitMQ cannot change a queue's type or arguments: the queue must be deleted and declared
again, and deleting a queue deletes its messages. :func:`redeclare_queues` moves each
queue's messages into a holding queue (``<queue>.redeclaring``), deletes the queue only
if it is still empty, declares it as :class:`QueueDeclarations` says, and moves the
messages back. A message is acknowledged at its source only once RabbitMQ confirmed its
copy, so a crash part-way can duplicate a message (the consumers' inbox absorbs the
copy) but never lose one; running it again finishes the job, holding queues first.

Nobody may consume or publish meanwhile: a queue with a consumer (a worker) is refused
before anything moves, and a queue that received a message while it was being emptied
(a relay still running) is not deleted.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingConnection

from .batches import describe
from .rabbitmq_queues import QueueDeclarations

#: The holding queue of ``<queue>`` while it is redeclared.
HOLDING_SUFFIX = ".redeclaring"


class RedeclareRefused(Exception):
    """A queue cannot be redeclared now (say why, and what to do)."""


class Action(enum.Enum):
    """What was done to a queue."""

    #: It did not exist: declared.
    CREATED = "declared"
    #: It had other arguments: emptied, deleted, declared again, refilled.
    REDECLARED = "redeclared"
    #: It was declared as asked already.
    UNCHANGED = "already"


@attrs.frozen
class Redeclared:
    """What happened to one queue."""

    #: The queue (``Q``, ``Q.DQ`` or ``Q.XQ``).
    name: str
    action: Action
    #: Messages moved in from the holding queue (this run's, or an interrupted run's).
    moved: int


def redeclare_queues(
    parameters: Sequence[pika.ConnectionParameters],
    declarations: QueueDeclarations,
    queue_names: Iterable[str],
    report: Callable[[Redeclared], None] = lambda _: None,
) -> list[Redeclared]:
    """Make every queue of ``queue_names`` (with its ``.DQ`` and ``.XQ``) declared as ``declarations`` says.

    Raises :class:`RedeclareRefused` if a queue has consumers or received messages meanwhile
    (what was done until then stays done: run it again once fixed).
    """
    names = [name for canonical in sorted(set(queue_names)) for name, _ in declarations.of(canonical)]
    done: list[Redeclared] = []
    try:
        connection = pika.BlockingConnection(list(parameters))
    except pika.exceptions.AMQPError as exc:
        raise RedeclareRefused(f"cannot connect to RabbitMQ: {describe(exc)}; nothing was changed") from None
    try:
        for name in names:  # every queue checked before anything moves
            _refuse_consumers(connection, name)
        for name in names:
            done.append(_redeclare(connection, name, declarations))
            report(done[-1])
        return done
    except pika.exceptions.AMQPError as exc:
        raise RedeclareRefused(
            f"RabbitMQ: {describe(exc)} after {len(done)} of {len(names)} queue(s); nothing was lost: run this again"
        ) from None
    finally:
        if connection.is_open:
            connection.close()


def _redeclare(connection: BlockingConnection, name: str, declarations: QueueDeclarations) -> Redeclared:
    arguments = declarations.arguments_of(name)
    holding = name + HOLDING_SUFFIX
    moved = 0
    # A channel per phase: RabbitMQ 3.10 crashes a channel that published to (or read from) a
    # queue and then publishes to a new queue of the same name and another type.
    if not _exists(connection, name):
        action = Action.CREATED
        _declare(connection, name, arguments)
    elif _declares(connection, name, arguments):
        action = Action.UNCHANGED
    else:
        action = Action.REDECLARED
        _declare(connection, holding, {"x-queue-type": declarations.queue_type})
        _move(connection, name, holding)
        _delete_empty(connection, name)
        _declare(connection, name, arguments)
    if _exists(connection, holding):  # this run's, or one an interrupted run left
        moved = _move(connection, holding, name)
        _delete_empty(connection, holding)
    return Redeclared(name, action, moved)


def _delete_empty(connection: BlockingConnection, name: str) -> None:
    """Delete ``name``, which must be empty and unconsumed.

    Quorum queues do not take ``if_empty``: the check is a passive declare just before.
    """
    found = _passive(connection, name)
    if found is not None and (found.message_count or found.consumer_count):
        raise RedeclareRefused(
            f"queue {name!r} received {found.message_count} message(s) or consumer(s) while it was being emptied:"
            " stop every relay and worker, then run this again"
        )
    channel = connection.channel()
    channel.queue_delete(name)
    channel.close()


def _declare(connection: BlockingConnection, name: str, arguments: dict[str, Any]) -> None:
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments=arguments)
    channel.close()


def _move(connection: BlockingConnection, source: str, target: str) -> int:
    """Move every message of ``source`` to ``target``, acking each once its copy is confirmed."""
    channel = connection.channel()
    channel.confirm_delivery()
    moved = 0
    while True:
        method, properties, body = channel.basic_get(source, auto_ack=False)
        if method is None:
            channel.close()
            return moved
        headers = {k: v for k, v in (properties.headers or {}).items() if k != "x-delivery-count"}
        properties.headers = headers or None
        # On a confirm channel this returns once RabbitMQ confirmed, or raises (nack, unroutable).
        channel.basic_publish("", target, body, properties, mandatory=True)
        channel.basic_ack(method.delivery_tag)
        moved += 1


def _passive(connection: BlockingConnection, name: str) -> Any:
    """The queue's passive declare (message and consumer counts), or ``None`` if it does not exist."""
    channel = connection.channel()
    try:
        frame = channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise
    channel.close()
    return frame.method


def _exists(connection: BlockingConnection, name: str) -> bool:
    return _passive(connection, name) is not None


def _refuse_consumers(connection: BlockingConnection, name: str) -> None:
    found = _passive(connection, name)
    if found is not None and found.consumer_count:
        raise RedeclareRefused(
            f"queue {name!r} has {found.consumer_count} consumer(s): stop every worker (and relay) first;"
            " nothing was changed"
        )


def _declares(connection: BlockingConnection, name: str, arguments: dict[str, Any]) -> bool:
    """Whether declaring ``name`` with ``arguments`` succeeds (``False``: it has other arguments)."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:
            return False
        raise
    channel.close()
    return True
