"""Publishing to RabbitMQ a batch at a time, with publisher confirms outstanding for the batch.

Dramatiq's ``RabbitmqBroker.enqueue`` with ``confirm_delivery`` waits for each confirm
before the next publish: one round trip per message. This publisher sends the whole
batch on a confirm-mode channel, then waits for the acks and nacks. The bytes and
queues are Dramatiq's own: the message body is ``Message.encode()``, the properties are
those ``enqueue`` sets (persistent, ``broker_priority``) plus the message id (which
matches a returned message to its row without reading its body; workers ignore it),
and each queue is declared with its ``.DQ`` and ``.XQ`` exactly as the workers' broker
declares them (:mod:`estafeta_brokers.rabbitmq_queues`: Dramatiq's classic queues, or quorum
queues), so ``dramatiq`` workers consume what it publishes.

pika's ``SelectConnection`` is the API with asynchronous confirms; the connection, its
channel and pika's I/O loop are driven by :mod:`estafeta_brokers.rabbitmq_link`, in the caller's
thread, only until what the caller waits for has happened.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from typing import Any

import pika
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from estafeta_sql.outbox import OutboxRow

from .batches import PublishOutcome, after_refusals, encode, encode_each
from .rabbitmq_link import Batch, Link, Unavailable
from .rabbitmq_queues import QueueDeclarations, quorum_priority_refusal

logger = logging.getLogger(__name__)

#: The name the relay's connections carry in RabbitMQ's management tools.
CONNECTION_NAME = "estafeta-relay"


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
        self._link = Link(self.parameters, connect_timeout)

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
        batch = Batch([(row, body) for row, body in encoded if row.id in sendable])
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
