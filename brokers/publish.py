"""Publishing claimed outbox rows through a Dramatiq broker, and reporting what it confirmed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import dramatiq
import dramatiq.errors

from sql.outbox import OutboxRow

logger = logging.getLogger(__name__)


@attrs.frozen
class PublishOutcome:
    """What became of a batch."""

    #: Rows the broker confirmed: the relay deletes them.
    confirmed: list[int] = attrs.field(factory=list)
    #: Rows the broker refused, with the reason: each counts a failed attempt.
    failed: dict[int, str] = attrs.field(factory=dict)
    #: Set when the broker could not be reached: the rows not confirmed stay pending
    #: without counting an attempt (an outage is not the rows' fault).
    broker_error: str | None = None


class Publisher(Protocol):
    """Carries rows to a broker."""

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Publish ``rows`` in order and report which the broker confirmed."""

    def close(self) -> None:
        """Release the broker connection."""


def to_message(row: OutboxRow) -> dramatiq.Message[Any]:
    """The Dramatiq message of an outbox row, with the row's id as its message id."""
    return dramatiq.Message(
        queue_name=row.queue_name,
        actor_name=row.actor_name,
        args=tuple(row.message.get("args", ())),
        kwargs=dict(row.message.get("kwargs", {})),
        options=dict(row.message.get("options", {})),
        message_id=str(row.message_id),
        message_timestamp=int(row.created_at.timestamp() * 1000),
    )


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the broker is unreachable (as opposed to refusing one message)."""
    if isinstance(exc, dramatiq.errors.ConnectionError):
        return True
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a dependency
        return False
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError)


class EnqueuePublisher:
    """Publishes through ``broker.enqueue``, one message at a time.

    Correct on every broker (RabbitMQ brokers built by ``broker_from_url`` wait for each
    publisher confirm), but one round trip per message.
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        outcome = PublishOutcome()
        stopped_keys: set[str] = set()
        for row in rows:
            if row.ordering_key is not None and row.ordering_key in stopped_keys:
                continue  # an older row of this key failed: keep the order, publish later
            try:
                self.broker.enqueue(to_message(row))
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}".strip()
                if is_connection_error(exc):
                    return attrs.evolve(outcome, broker_error=reason)
                outcome.failed[row.id] = reason
                if row.ordering_key is not None:
                    stopped_keys.add(row.ordering_key)
            else:
                outcome.confirmed.append(row.id)
        return outcome

    def close(self) -> None:
        self.broker.close()


def publisher_for(broker: dramatiq.Broker) -> Publisher:
    """The fastest correct publisher for ``broker``."""
    return EnqueuePublisher(broker)
