"""Publishing to RabbitMQ a batch at a time, with publisher confirms outstanding for the batch.

Dramatiq's ``RabbitmqBroker.enqueue`` with ``confirm_delivery`` waits for each confirm
before the next publish: one round trip per message. This publisher sends the whole
batch on a confirm-mode channel, then waits for the acks and nacks. The bytes and
queues are Dramatiq's own: the message body is ``Message.encode()``, the properties are
those ``enqueue`` sets (persistent, ``broker_priority``) plus the message id (which
matches a returned message to its row without reading its body; workers ignore it),
and each queue is declared with its ``.DQ`` and ``.XQ`` exactly as the workers' broker
declares them (:mod:`brokers.rabbitmq_queues`: Dramatiq's classic queues, or quorum
queues), so ``dramatiq`` workers consume what it publishes.

pika's ``SelectConnection`` is the API with asynchronous confirms; its I/O loop is run
here, in the caller's thread, only until what the caller waits for has happened.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
import pika.spec
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from sql.outbox import OutboxRow

from .batches import PublishOutcome, after_refusals, describe, encode, encode_each
from .rabbitmq_queues import QueueDeclarations, quorum_priority_refusal

logger = logging.getLogger(__name__)

#: The name the relay's connections carry in RabbitMQ's management tools.
CONNECTION_NAME = "estafeta-relay"


class Unavailable(Exception):
    """The connection could not be opened or was lost."""


class _Timeout(Exception):
    """What we waited for did not happen in time."""


class RabbitmqPublisher:
    """Publishes a batch with publisher confirms outstanding for all of it.

    A row is confirmed only by RabbitMQ's ack. A nack defers the row: RabbitMQ nacks
    when it cannot take a message now (its queue's replica down or being elected, a full
    queue that rejects publishes), never for the message itself, so the row backs off
    without being parked. A queue RabbitMQ refuses to declare (say, declared elsewhere
    with other arguments) fails that queue's rows; a lost connection, or no confirm within
    ``confirm_timeout``, leaves every unconfirmed row pending and reports the broker
    unavailable.
    """

    def __init__(
        self,
        parameters: Sequence[pika.ConnectionParameters],
        *,
        declarations: QueueDeclarations | None = None,
        confirm_timeout: float = 15.0,
        connect_timeout: float = 10.0,
        idle_reconnect: float = 25.0,
    ) -> None:
        self.parameters = [_named(p) for p in parameters]
        #: How queues are declared: the workers' broker's own, so both declare identically.
        self.declarations = declarations or QueueDeclarations()
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        #: A connection idle this long is replaced before use: nobody answered the
        #: broker's heartbeats meanwhile, so it may be closing it.
        self.idle_reconnect = idle_reconnect
        self._link = _Link(self.parameters, connect_timeout)

    @classmethod
    def for_broker(cls, broker: RabbitmqBroker, **options: Any) -> RabbitmqPublisher:
        """A publisher to the server(s) ``broker`` connects to, declaring queues as it does."""
        parameters = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
        declarations = getattr(broker, "declarations", None) or QueueDeclarations(max_priority=broker.max_priority)
        return cls(parameters, declarations=declarations, **options)

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Publish ``rows`` in order on one channel; report what RabbitMQ confirmed."""
        if not rows:
            return PublishOutcome()
        # One bound for the whole attempt (handshake, channel, declares, confirms): a broker
        # that accepts and then stops answering at any step is reported within it.
        self._link.attempt_until = time.monotonic() + self.confirm_timeout
        self._link.attempt_bound = self.confirm_timeout
        try:
            return self._publish(rows)
        finally:
            self._link.attempt_until = None

    def _publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        try:
            self._link.ensure_open(self.idle_reconnect)
            refused = self._declare(sorted({row.queue_name for row in rows}))
        except Unavailable as exc:
            return PublishOutcome(broker_error=str(exc))
        encoded, failed = encode_each(rows, encode)
        if self.declarations.quorum:
            failed.update(_with_priority(rows))
        failed.update({row.id: refused[row.queue_name] for row, _ in encoded if row.queue_name in refused})
        sendable = {row.id for row in after_refusals(rows, failed)}
        batch = _Batch([(row, body) for row, body in encoded if row.id in sendable])
        try:
            self._link.publish(batch, self.confirm_timeout)
        except Unavailable as exc:
            return PublishOutcome(
                confirmed=batch.confirmed,
                failed={**failed, **batch.failed},
                deferred=batch.deferred,
                broker_error=str(exc),
            )
        for queue_name in batch.unroutable_queues:
            self._link.declared.discard(queue_name)  # deleted behind our back: declare again next time
        return PublishOutcome(confirmed=batch.confirmed, failed={**failed, **batch.failed}, deferred=batch.deferred)

    def _declare(self, queue_names: list[str]) -> dict[str, str]:
        """Declare the queues not declared on this connection yet; return the refused ones with why."""
        refused = {}
        for queue_name in queue_names:
            if queue_name in self._link.declared:
                continue
            declarations = self.declarations.of(queue_name)
            refusal = self._link.declare(declarations)
            if refusal is None:
                self._link.declared.add(queue_name)
            else:
                name, code, reason = refusal
                if code == 406:  # PRECONDITION_FAILED: declared elsewhere with other arguments
                    refused[queue_name] = self.declarations.mismatch(name, reason)
                else:
                    refused[queue_name] = f"RabbitMQ refused to declare queue {name!r}: {reason}"
                logger.warning("relay: %s", refused[queue_name])
        return refused

    def close(self) -> None:
        """Close the connection (politely, if the broker still answers)."""
        self._link.close()


def _with_priority(rows: Sequence[OutboxRow]) -> dict[int, str]:
    # A quorum queue (RabbitMQ 3.x) ignores a message's priority: refuse it instead.
    return {
        row.id: f"outbox row {row.id} {quorum_priority_refusal(row.queue_name)}"
        for row in rows
        if row.message.get("options", {}).get("broker_priority") is not None
    }


def _named(parameters: pika.ConnectionParameters) -> pika.ConnectionParameters:
    named = copy.copy(parameters)
    named.client_properties = {**(parameters.client_properties or {}), "connection_name": CONNECTION_NAME}
    return named


class _Batch:
    """The rows of one publish (with their encoded bodies) and what RabbitMQ said about each."""

    def __init__(self, rows: Sequence[tuple[OutboxRow, bytes]]) -> None:
        self.rows = list(rows)
        #: Delivery tag -> row, for rows published and not yet acked or nacked.
        self.unsettled: dict[int, OutboxRow] = {}
        self.confirmed: list[int] = []
        self.failed: dict[int, str] = {}
        #: Nacked rows: RabbitMQ could not take them now (a queue replica down or being
        #: elected, a full queue with ``reject-publish``), never a fault of the message.
        self.deferred: dict[int, str] = {}
        #: Message ids RabbitMQ returned as unroutable (their queue vanished), from the
        #: ``message_id`` property each message is published with.
        self.returned: set[str] = set()
        #: A message came back without our ``message_id`` property: nothing acked in this
        #: batch counts as confirmed (published again, the inbox absorbs the copies).
        self.unmatched_return = False
        self.unroutable_queues: set[str] = set()

    def settle(self, tag: int, multiple: bool, acked: bool) -> None:
        """Apply an ack or nack for ``tag`` (and every lower tag when ``multiple``)."""
        # Tags were added in increasing order, so the ones covered by a multiple ack lead.
        tags = list(itertools.takewhile(lambda t: t <= tag, self.unsettled)) if multiple else [tag]
        for t in tags:
            row = self.unsettled.pop(t, None)
            if row is None:
                continue
            if not acked:
                self.deferred[row.id] = f"RabbitMQ nacked the message on queue {row.queue_name!r}"
            elif self.unmatched_return or str(row.message_id) in self.returned:
                # Acked after a return: nobody has it. Not the row's fault; it stays pending.
                self.unroutable_queues.add(row.queue_name)
            else:
                self.confirmed.append(row.id)


class _Link:
    """One ``SelectConnection`` and its confirm-mode channel, driven from the caller's thread."""

    def __init__(self, parameters: Sequence[pika.ConnectionParameters], connect_timeout: float) -> None:
        self.parameters = parameters
        self.connect_timeout = connect_timeout
        self.connection: Any = None
        self.channel: Any = None
        self.declared: set[str] = set()
        self.close_reason: str | None = None
        self.channel_close_reason: str | None = None
        self.channel_close_error: BaseException | None = None
        self.last_used = 0.0
        self._next_tag = 0
        self._confirming = False
        self._batch: _Batch | None = None
        self._until: Callable[[], bool] | None = None
        #: ``time.monotonic()`` by which the publish under way must be done (``None``: each wait's own bound).
        self.attempt_until: float | None = None
        #: The whole attempt's bound, seconds (what a timeout says when the attempt's deadline cut it).
        self.attempt_bound = 0.0

    # -- opening and closing -------------------------------------------------

    def ensure_open(self, idle_reconnect: float) -> None:
        """An open connection and confirm channel, or :class:`Unavailable`."""
        if self._is_open() and time.monotonic() - self.last_used > idle_reconnect:
            self.close()
        elif self._is_open():
            ioloop_once(self.connection.ioloop)  # notice a close the broker sent meanwhile
        if not self._is_open():
            self._connect()
        if self.channel is None or not self.channel.is_open:
            self._open_channel()
        self.last_used = time.monotonic()

    def _is_open(self) -> bool:
        return self.connection is not None and self.connection.is_open

    def _connect(self) -> None:
        errors: list[str] = []
        for tried, parameters in enumerate(self.parameters):
            if tried and self.attempt_until is not None:  # failing over: the next host gets its own time
                self.attempt_until = max(self.attempt_until, time.monotonic() + self.connect_timeout)
            self.close_reason = None
            self.declared.clear()
            self.connection = pika.SelectConnection(
                parameters,
                on_open_callback=self._on_event,
                on_open_error_callback=self._on_connection_closed,
                on_close_callback=self._on_connection_closed,
            )
            try:
                self._run(lambda: self.connection.is_open, self.connect_timeout, "the connection to open")
                if errors:  # failed over: an operator should know a node is gone
                    where = f"{parameters.host}:{parameters.port}"
                    logger.warning("relay: connected to RabbitMQ at %s; not reached: %s", where, "; ".join(errors))
                return
            except (Unavailable, _Timeout) as exc:
                errors.append(f"{parameters.host}:{parameters.port}: {exc}")
                self._abandon()
        raise Unavailable("cannot connect to RabbitMQ (" + "; ".join(errors) + ")")

    def _open_channel(self) -> None:
        self.channel = None
        self.channel_close_reason = None
        self.channel_close_error = None
        self._next_tag = 0
        self.connection.channel(on_open_callback=self._on_channel_open)
        try:
            self._run(lambda: self.channel is not None and self._confirming, self.connect_timeout, "a channel")
        except _Timeout as exc:
            self._abandon()
            raise Unavailable(str(exc)) from None

    def close(self) -> None:
        """Close the connection, waiting a moment for the broker's answer."""
        if self._is_open():
            try:
                self.connection.close()
                self._run(lambda: not self._is_open(), 2.0, "the connection to close", closing=True)
            except (Unavailable, _Timeout, pika.exceptions.AMQPError):
                pass
        self._abandon()

    def _abandon(self) -> None:
        self.connection = None
        self.channel = None
        self._confirming = False

    # -- declaring and publishing ----------------------------------------------

    def declare(self, declarations: list[tuple[str, dict[str, Any]]]) -> tuple[str, int, str] | None:
        """Declare the queues; ``None``, or the queue RabbitMQ refused, its reply code and text."""
        done: list[str] = []
        channel = self.channel

        def declared(_frame: Any) -> None:
            done.append("ok")
            self._poke()

        for name, arguments in declarations:
            channel.queue_declare(name, durable=True, arguments=arguments, callback=declared)
        try:
            self._run(lambda: len(done) == len(declarations) or not channel.is_open, self.connect_timeout, "declares")
        except _Timeout as exc:
            self._abandon()
            raise Unavailable(str(exc)) from None
        if len(done) == len(declarations):
            return None
        # RabbitMQ answers in order and closes the channel at the first refusal.
        refused = declarations[len(done)][0]
        code = getattr(self.channel_close_error, "reply_code", 0)
        text = getattr(self.channel_close_error, "reply_text", None) or self.channel_close_reason or "channel closed"
        self._open_channel()  # the refusal closed the channel; the connection is fine
        return refused, code, text

    def publish(self, batch: _Batch, timeout: float) -> None:
        """Send ``batch`` and wait until every row is acked or nacked (or the channel closes)."""
        self._batch = batch
        channel = self.channel
        try:
            self._send(channel, batch)
            self._run(lambda: not batch.unsettled or not channel.is_open, timeout, "publisher confirms")
        except _Timeout as exc:
            self.close()
            raise Unavailable(f"{exc}; RabbitMQ may be blocked (memory or disk alarm)") from None
        except pika.exceptions.AMQPError as exc:
            self._abandon()
            raise Unavailable(describe(exc)) from None
        finally:
            self._batch = None
            self.last_used = time.monotonic()
        if batch.unsettled:
            # The broker closed the channel: blame the oldest unsettled row (the channel
            # stops at the first message it refuses); the others stay pending.
            first = min(batch.unsettled)
            batch.failed[batch.unsettled[first].id] = f"RabbitMQ closed the channel: {self.channel_close_reason}"
            self.channel = None

    def _send(self, channel: Any, batch: _Batch) -> None:
        # What RabbitmqBroker.enqueue sets: persistent, and the message's broker priority;
        # mandatory, so that a message no queue takes comes back instead of vanishing, and
        # the message id as a property, so that a returned message is known without
        # reading its body (workers ignore the property).
        for row, body in batch.rows:
            priority = row.message.get("options", {}).get("broker_priority")
            properties = pika.BasicProperties(delivery_mode=2, priority=priority, message_id=str(row.message_id))
            channel.basic_publish("", row.queue_name, body, properties, mandatory=True)
            self._next_tag += 1
            batch.unsettled[self._next_tag] = row

    # -- the I/O loop ---------------------------------------------------------

    def _run(self, until: Callable[[], bool], timeout: float, what: str, *, closing: bool = False) -> None:
        """Run the I/O loop until ``until()``.

        Raises :class:`Unavailable` if the connection is closed (unless ``closing``) and
        :class:`_Timeout` after ``timeout`` seconds.
        """
        deadline, bound = time.monotonic() + timeout, timeout
        if self.attempt_until is not None and not closing and self.attempt_until < deadline:
            deadline, bound = self.attempt_until, self.attempt_bound
        ioloop = self.connection.ioloop
        while not until():
            if self.connection.is_closed:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout(f"no answer within {bound:g} s (waiting for {what})")
            self._until = until
            # Callbacks stop the loop as soon as ``until()`` holds; the short slice bounds
            # what a callback that forgets to is worth.
            timer = ioloop.call_later(min(remaining, 0.25), ioloop.stop)
            try:
                ioloop.start()
            finally:
                ioloop.remove_timeout(timer)
                self._until = None
        if self.connection.is_closed and not closing:
            raise Unavailable(self.close_reason or "connection closed")

    def _poke(self) -> None:
        if self._until is None or self._until():
            self.connection.ioloop.stop()

    # -- callbacks -------------------------------------------------------------

    def _on_event(self, *_: Any) -> None:
        self._poke()

    def _on_connection_closed(self, _connection: Any, reason: BaseException) -> None:
        self.close_reason = describe(reason)
        self.channel = None
        self._confirming = False
        self._connection_ioloop_stop()

    def _connection_ioloop_stop(self) -> None:
        if self.connection is not None:
            self.connection.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self.channel = channel
        self._confirming = False
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select)

    def _on_confirm_select(self, _frame: Any) -> None:
        self._confirming = True
        self._poke()

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        if channel is self.channel or self.channel is None:
            self.channel_close_reason = describe(reason)
            self.channel_close_error = reason
        self._connection_ioloop_stop()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if self._batch is not None:
            self._batch.settle(method.delivery_tag, method.multiple, isinstance(method, pika.spec.Basic.Ack))
        self._poke()

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        if self._batch is None:
            return
        message_id = getattr(properties, "message_id", None)
        if message_id is None:
            self._batch.unmatched_return = True
        else:
            self._batch.returned.add(str(message_id))
        logger.warning("relay: RabbitMQ returned a message for queue %r: %s", method.routing_key, method.reply_text)


def ioloop_once(ioloop: Any) -> None:
    """Run one pass of pika's I/O loop: read what arrived, fire due timers."""
    timer = ioloop.call_later(0, ioloop.stop)
    try:
        ioloop.start()
    finally:
        ioloop.remove_timeout(timer)
