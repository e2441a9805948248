"""One pika ``SelectConnection`` and its confirm-mode channel, driven from the caller's thread.

What :class:`estafeta_brokers.rabbitmq.RabbitmqPublisher` needs of RabbitMQ, apart from what it
decides about rows: opening a connection (failing over to the next host), a channel in
confirm mode, declaring queues, sending a batch and collecting its acks, nacks and
returns (:class:`Batch`), all within one deadline per publish attempt. pika's I/O loop is
run only until what the caller waits for has happened.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
import pika.spec

from estafeta_sql.outbox import OutboxRow

from .batches import describe

# The publisher's logger: the relay's RabbitMQ warnings keep one name, whichever module logs them.
logger = logging.getLogger("estafeta_brokers.rabbitmq")


class Unavailable(Exception):
    """The connection could not be opened or was lost."""


class _Timeout(Exception):
    """What we waited for did not happen in time."""


class Batch:
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


class Link:
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
        self._batch: Batch | None = None
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

    def publish(self, batch: Batch, timeout: float) -> None:
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

    def _send(self, channel: Any, batch: Batch) -> None:
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
