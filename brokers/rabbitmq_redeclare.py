"""Redeclaring RabbitMQ queues with other arguments (classic to quorum, or back), keeping their messages.

RabbitMQ cannot change a queue's type or arguments: the queue must be deleted and declared
again, and deleting a queue deletes its messages. :func:`redeclare_queues` moves each
queue's messages into a holding queue (``<queue>.redeclaring``), deletes the queue only
if it is still empty (``if_empty``: RabbitMQ refuses to delete a classic queue that
received a message meanwhile), declares it as :class:`QueueDeclarations` says, and moves
the messages back. A message is acknowledged at its source only once RabbitMQ confirmed its
copy, so a crash part-way can duplicate a message (the consumers' inbox absorbs the
copy) but never lose one; running it again finishes the job, holding queues first.

Nobody may consume or publish meanwhile: a queue with a consumer (a worker) is refused
before anything moves, and a classic queue that received a message while it was being
emptied (a relay still running) is not deleted. RabbitMQ 3.10 takes no ``if_empty`` on
quorum queues, so a quorum queue's emptiness can only be checked before its delete, and a
message published between the two would be lost: a quorum queue is redeclared only once the
caller's ``users`` names no live process that could publish to it or consume it (the CLI
reads the heartbeats: every live relay of the app, every live worker of the queue);
otherwise :class:`QueueInUse`, the queue left as it is.
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


class QueueInUse(RedeclareRefused):
    """A quorum queue was left as it is: live processes could publish to it or consume it meanwhile."""


#: The live processes (one description each) that could publish to or consume a queue, by its name.
Users = Callable[[str], Sequence[str]]


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
    users: Users = lambda _: (),
) -> list[Redeclared]:
    """Make every queue of ``queue_names`` (with its ``.DQ`` and ``.XQ``) declared as ``declarations`` says.

    Raises :class:`RedeclareRefused` if a queue has consumers or received messages meanwhile,
    and :class:`QueueInUse` before touching a quorum queue ``Q`` (or its ``.DQ``, ``.XQ``)
    for which ``users(Q)`` names someone (what was done until then stays done: run it again
    once fixed).
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
            done.append(_redeclare(connection, parameters, name, declarations, users))
            report(done[-1])
        return done
    except pika.exceptions.AMQPError as exc:
        raise RedeclareRefused(
            f"RabbitMQ: {describe(exc)} after {len(done)} of {len(names)} queue(s); nothing was lost: run this again"
        ) from None
    finally:
        if connection.is_open:
            connection.close()


def _redeclare(
    connection: BlockingConnection,
    parameters: Sequence[pika.ConnectionParameters],
    name: str,
    declarations: QueueDeclarations,
    users: Users,
) -> Redeclared:
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
        _replace(connection, parameters, name, declarations.queue_type, users)
        _declare(connection, name, arguments)
    if _exists(connection, holding):  # this run's, or one an interrupted run left
        moved = _move(connection, holding, name)
        _delete_empty(connection, parameters, holding)
    return Redeclared(name, action, moved)


def _replace(
    connection: BlockingConnection,
    parameters: Sequence[pika.ConnectionParameters],
    name: str,
    queue_type: str,
    users: Users,
) -> None:
    """Delete ``name``, its messages kept in its holding queue; a quorum queue only if ``users`` names nobody.

    The first delete (``if_empty``) tells the types apart without a change to a queue that holds
    messages: RabbitMQ deletes an empty classic queue (nothing to keep), refuses a classic queue
    that holds messages, and refuses any quorum queue with ``NOT_IMPLEMENTED``.
    """
    deleted, _ = _delete_if_empty(parameters, name)
    if deleted is _Deletion.DELETED:
        return
    if deleted is _Deletion.QUORUM:
        _refuse_users(name, users)
    _declare(connection, name + HOLDING_SUFFIX, {"x-queue-type": queue_type})
    _move(connection, name, name + HOLDING_SUFFIX)
    _delete_empty(connection, parameters, name)


def _refuse_users(name: str, users: Users) -> None:
    found = users(name.removesuffix(".DQ").removesuffix(".XQ"))
    if found:
        raise QueueInUse(
            f"quorum queue {name!r} cannot be redeclared while live processes could publish to it or consume it"
            f" ({'; '.join(found)}): RabbitMQ takes no if-empty delete on a quorum queue, so a message published"
            " meanwhile would be lost; stop them first, then run this again (the queue was left as it is)"
        )


class _Deletion(enum.Enum):
    """What a delete with ``if_empty`` and ``if_unused`` did."""

    DELETED = "deleted"
    #: A classic queue holding messages or consumed: kept.
    KEPT = "kept"
    #: A quorum queue: RabbitMQ 3.10 takes neither flag, and kept it.
    QUORUM = "quorum"


def _delete_if_empty(parameters: Sequence[pika.ConnectionParameters], name: str) -> tuple[_Deletion, str]:
    """Delete ``name`` if it is empty and unconsumed (RabbitMQ decides); what happened, and RabbitMQ's reply.

    On a connection of its own: a quorum queue refuses the flags by closing the connection.
    """
    try:
        with pika.BlockingConnection(list(parameters)) as own:
            own.channel().queue_delete(name, if_unused=True, if_empty=True)
        return _Deletion.DELETED, ""
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 406:  # PRECONDITION_FAILED: not empty, or consumed
            raise
        return _Deletion.KEPT, exc.reply_text
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code != 540:  # NOT_IMPLEMENTED: a quorum queue
            raise
        return _Deletion.QUORUM, exc.reply_text


def _delete_empty(connection: BlockingConnection, parameters: Sequence[pika.ConnectionParameters], name: str) -> None:
    """Delete ``name`` only if it is empty and unconsumed; else :class:`RedeclareRefused`, the queue kept.

    RabbitMQ decides, with ``if_empty`` and ``if_unused``, so a message published after a
    classic queue was emptied keeps it. A quorum queue, which takes neither flag, is checked
    just before its delete (its publishers were found stopped before it was emptied).
    """
    deleted, server_says = _delete_if_empty(parameters, name)
    if deleted is _Deletion.DELETED:
        return
    if deleted is _Deletion.KEPT:
        raise RedeclareRefused(_not_empty(name, server_says))
    found = _passive(connection, name)
    if found is not None and (found.message_count or found.consumer_count):
        raise RedeclareRefused(
            _not_empty(name, f"{found.message_count} message(s), {found.consumer_count} consumer(s)")
        )
    channel = connection.channel()
    channel.queue_delete(name)
    channel.close()


def _not_empty(name: str, server_says: str) -> str:
    return (
        f"queue {name!r} received messages or a consumer while it was being emptied ({server_says}), so it was"
        " not deleted and nothing was lost: stop every relay and worker, then run this again"
    )


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
