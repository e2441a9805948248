"""The queues estafeta declares on RabbitMQ: Dramatiq's three per queue, classic or quorum.

Dramatiq declares, for each queue ``Q``, ``Q`` and its delay queue ``Q.DQ`` (both
dead-lettering into ``Q.XQ``) and ``Q.XQ`` (keeping dead messages for
``DEAD_MESSAGE_TTL``). Workers (through :class:`QueueTypedRabbitmqBroker`) and the relay
(through :class:`estafeta_brokers.rabbitmq.RabbitmqPublisher`) both take their arguments from one
:class:`QueueDeclarations`, so that they declare the same queues identically: RabbitMQ
refuses a second declaration with other arguments (``PRECONDITION_FAILED``).

``classic`` (the default) declares exactly what Dramatiq does, so an existing deployment
keeps its queues. ``quorum`` declares replicated quorum queues (``x-queue-type: quorum``)
with the same dead-letter arguments and an ``x-delivery-limit``: RabbitMQ dead-letters a
message after it has been delivered ``limit + 1`` times, so a limit equal to
``ESTAFETA_MAX_DELIVERIES`` lets the inbox see the delivery past the maximum and park the
message itself, with its reason; RabbitMQ's own limit is the backstop when it cannot.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs
import dramatiq
import dramatiq.errors
import pika.exceptions
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, RabbitmqBroker
from dramatiq.common import dq_name, xq_name

#: The queue types estafeta declares.
QUEUE_TYPES = ("classic", "quorum")

#: The arguments a quorum queue takes (RabbitMQ 3.10): estafeta refuses any other before
#: RabbitMQ sees it, instead of letting it be dropped or fail one declaration at a time.
QUORUM_ARGUMENTS = frozenset(
    {
        "x-queue-type",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-delivery-limit",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-message-ttl",
        "x-overflow",
        "x-quorum-initial-group-size",
        "x-single-active-consumer",
    }
)

#: Where the documentation explains a mismatch and how to migrate.
MIGRATION_DOCS = "docs/how-to/quorum-queues.md"

Declarations = list[tuple[str, dict[str, Any]]]


class QueueMismatch(Exception):
    """RabbitMQ holds a queue of this name declared with other arguments than estafeta's."""


def check_quorum_arguments(queue_name: str, arguments: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming every argument of ``queue_name`` a quorum queue does not take."""
    refused = sorted(set(arguments) - QUORUM_ARGUMENTS)
    if refused:
        raise ValueError(f"quorum queue {queue_name!r} cannot take the argument(s) {', '.join(refused)}")


@attrs.frozen
class QueueDeclarations:
    """How every queue is declared: its type, the quorum delivery limit, Dramatiq's ``max_priority``.

    ``ValueError`` at construction for a combination RabbitMQ would refuse or ignore:
    an unknown type, priorities on quorum queues, a delivery limit on classic ones.
    """

    #: ``classic`` (Dramatiq's own declarations) or ``quorum``.
    queue_type: str = "classic"
    #: Quorum queues only: deliveries after the first before RabbitMQ dead-letters a message.
    delivery_limit: int | None = None
    #: Classic queues only: Dramatiq's ``max_priority`` (``x-max-priority``).
    max_priority: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.queue_type not in QUEUE_TYPES:
            raise ValueError(f"unknown queue type {self.queue_type!r} (expected {' or '.join(QUEUE_TYPES)})")
        if self.queue_type == "classic" and self.delivery_limit is not None:
            raise ValueError("a delivery limit needs quorum queues: classic queues do not count deliveries")
        if self.delivery_limit is not None and self.delivery_limit < 1:
            raise ValueError(f"delivery limit {self.delivery_limit} is below 1")
        if self.quorum and self.max_priority:
            raise ValueError(
                f"quorum queues take no priorities: max_priority={self.max_priority} (x-max-priority) is refused;"
                " drop it and the broker_priority option, or keep classic queues"
            )
        if self.quorum:
            for name, arguments in self.of("<queue>"):
                check_quorum_arguments(name, arguments)

    @property
    def quorum(self) -> bool:
        """Whether the queues are quorum queues."""
        return self.queue_type == "quorum"

    def of(self, queue_name: str) -> Declarations:
        """The queues Dramatiq declares for ``queue_name`` (itself, ``.DQ``, ``.XQ``), with their arguments."""
        arguments: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": xq_name(queue_name)}
        dead: dict[str, Any] = {"x-message-ttl": DEAD_MESSAGE_TTL}
        if self.max_priority:
            arguments["x-max-priority"] = self.max_priority
        if self.quorum:
            arguments["x-queue-type"] = dead["x-queue-type"] = "quorum"
            # Not on .XQ: a message past the limit there would be dropped, having nowhere to go.
            if self.delivery_limit is not None:
                arguments["x-delivery-limit"] = self.delivery_limit
        return [(queue_name, arguments), (dq_name(queue_name), dict(arguments)), (xq_name(queue_name), dead)]

    def arguments_of(self, name: str) -> dict[str, Any]:
        """The arguments of one declared queue (``Q``, ``Q.DQ`` or ``Q.XQ``)."""
        canonical = name.removesuffix(".DQ").removesuffix(".XQ")
        return dict(next(arguments for declared, arguments in self.of(canonical) if declared == name))

    def mismatch(self, name: str, server_says: str) -> str:
        """The one-line error for RabbitMQ refusing queue ``name`` (``server_says``: its reply text)."""
        ours = ", ".join(f"{key}={value!r}" for key, value in sorted(self.arguments_of(name).items()))
        return (
            f"queue {name!r} exists on RabbitMQ with other arguments than estafeta declares"
            f" ({self.queue_type}: {ours}); RabbitMQ says: {server_says}; see {MIGRATION_DOCS}"
        )


class QueueTypedRabbitmqBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker, declaring its queues as :class:`QueueDeclarations` says.

    A queue RabbitMQ already holds with other arguments raises :class:`QueueMismatch`
    (one line: the queue, estafeta's arguments, RabbitMQ's reply) instead of Dramatiq's
    retried ``ConnectionClosed``. A message with a ``broker_priority`` on quorum queues,
    which would silently lose its priority, raises ``ValueError``.
    """

    def __init__(self, *, declarations: QueueDeclarations, **options: Any) -> None:
        super().__init__(max_priority=declarations.max_priority, **options)
        self.declarations = declarations
        self.add_middleware(DeclareQueuesAtBoot())

    def _declare(self, name: str) -> Any:
        arguments = self.declarations.arguments_of(name)
        try:
            return self.channel.queue_declare(queue=name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 406:  # PRECONDITION_FAILED
                raise
            del self.channel  # RabbitMQ closed it
            raise QueueMismatch(self.declarations.mismatch(name, exc.reply_text)) from None

    def _declare_queue(self, queue_name: str) -> Any:
        return self._declare(queue_name)

    def _declare_dq_queue(self, queue_name: str) -> Any:
        return self._declare(dq_name(queue_name))

    def _declare_xq_queue(self, queue_name: str) -> Any:
        return self._declare(xq_name(queue_name))

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        if self.declarations.quorum and message.options.get("broker_priority") is not None:
            raise ValueError(f"message {message.message_id}: {quorum_priority_refusal(message.queue_name)}")
        return super().enqueue(message, delay=delay)


def quorum_priority_refusal(queue_name: str) -> str:
    """Why a message with a ``broker_priority`` is refused on quorum queue ``queue_name``."""
    return f"has a broker_priority, but queue {queue_name!r} is a quorum queue, which has no priorities"


class DeclareQueuesAtBoot(dramatiq.Middleware):
    """Declares every queue of a ``dramatiq`` worker process when it boots; a mismatch stops it.

    Dramatiq declares a queue when its consumer starts, and retries a refused declaration
    forever with a traceback per attempt. Declared up front, a queue RabbitMQ holds with
    other arguments ends the process (exit code 2) with one line naming it and both
    argument sets. RabbitMQ being unreachable does not: the consumers retry as usual.
    """

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        assert isinstance(broker, QueueTypedRabbitmqBroker)
        try:
            for queue_name in sorted(broker.get_declared_queues()):
                broker.declare_queue(queue_name, ensure=True)
        except QueueMismatch as exc:
            print(f"estafeta: {exc}", file=sys.stderr, flush=True)
            # SystemExit passes through Dramatiq's middleware dispatch (it catches Exception).
            raise SystemExit(2) from None
        except dramatiq.errors.ConnectionError:
            pass  # RabbitMQ unreachable: the consumers declare once it is back
        finally:
            # This thread's connection would sit idle, missing heartbeats: close it.
            del broker.connection
