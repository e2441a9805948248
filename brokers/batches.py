"""A batch of outbox rows on its way to a broker: its bytes, which rows may go, and the outcome.

What every publisher shares (:mod:`estafeta_brokers.publish` picks one per broker; the RabbitMQ,
Redis and Kafka publishers build on this module), kept apart from the choosing so that the
publishers never import the module that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import dramatiq

from estafeta_sql.outbox import OutboxRow

T = TypeVar("T")


@attrs.frozen
class PublishOutcome:
    """What became of a batch. Rows in neither list stay pending without counting an attempt."""

    #: Rows the broker confirmed: the relay deletes them.
    confirmed: list[int] = attrs.field(factory=list)
    #: Rows the broker refused, with the reason: each counts a failed attempt.
    failed: dict[int, str] = attrs.field(factory=dict)
    #: Rows the broker turned away for now, with the reason (a RabbitMQ nack: a queue
    #: replica down, a full queue that rejects publishes): each waits out a growing
    #: backoff, counted, but is never parked as ``failed`` for it.
    deferred: dict[int, str] = attrs.field(factory=dict)
    #: Set when the broker could not be reached: the rows not confirmed stay pending
    #: without counting an attempt (an outage is not the rows' fault).
    broker_error: str | None = None


def encode(row: OutboxRow, **extra_options: Any) -> bytes:
    """``publish.to_message(row).encode()`` (plus ``extra_options``), the same bytes without the message.

    The fields go to Dramatiq's global encoder in ``Message.asdict()`` order, so the
    body is exactly what ``broker.enqueue`` would have sent.
    """
    options = row.message.get("options", {})
    return dramatiq.get_encoder().encode(
        {
            "queue_name": row.queue_name,
            "actor_name": row.actor_name,
            "args": tuple(row.message.get("args", ())),
            "kwargs": row.message.get("kwargs", {}),
            "options": {**options, **extra_options} if extra_options else options,
            "message_id": str(row.message_id),
            "message_timestamp": int(row.created_at.timestamp() * 1000),
        }
    )


def describe(exc: BaseException) -> str:
    """``exc`` as one line for ``last_error`` and logs."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def after_refusals(rows: Iterable[OutboxRow], refused: Iterable[int]) -> list[OutboxRow]:
    """``rows`` minus the refused ones and every later row of a refused row's key.

    A key's later rows must not overtake its refused row: they wait in the outbox
    (no attempt counted) until it goes out.
    """
    refused = set(refused)
    stopped: set[str] = set()
    kept = []
    for row in rows:
        if row.id in refused or row.ordering_key in stopped:
            if row.ordering_key is not None:
                stopped.add(row.ordering_key)
            continue
        kept.append(row)
    return kept


def encode_each(
    rows: Iterable[OutboxRow], encode_row: Callable[[OutboxRow], T]
) -> tuple[list[tuple[OutboxRow, T]], dict[int, str]]:
    """Each row with what ``encode_row`` made of it, and the rows it could not encode, with why.

    A row that cannot be encoded (its message is not what the outbox writes: edited by
    hand, written by a bug) is the row's fault: it counts a failed attempt, alone, and
    its key's later rows wait behind it, as for a refusal.
    """
    encoded: list[tuple[OutboxRow, T]] = []
    failed: dict[int, str] = {}
    stopped: set[str] = set()
    for row in rows:
        if row.ordering_key is not None and row.ordering_key in stopped:
            continue
        try:
            encoded.append((row, encode_row(row)))
        except Exception as exc:
            failed[row.id] = f"the row cannot be encoded as a Dramatiq message: {describe(exc)}"
            if row.ordering_key is not None:
                stopped.add(row.ordering_key)
    return encoded, failed
