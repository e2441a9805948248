"""What one delivery tells its operator: a ``process`` span, log lines that name it, metrics.

:func:`delivery` wraps the processing of one message by a step (``estafeta.deliver``):
while it runs, the span is current (the messages the step sends are its children) and
every log line carries the actor, message id, saga id and trace id. It only observes:
the transaction, inbox and outbox run inside it, and an exception passes through.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import attrs

from estafeta.observability import logs as logs
from estafeta.observability import metrics as metrics
from estafeta.observability import tracing as tracing


@attrs.define
class Seen:
    """What the delivery found out, filled in while it runs."""

    #: The outcome (an ``Outcome`` value), ``error`` if it raised.
    outcome: str = "error"
    #: Deliveries of this message so far, by the inbox's count.
    attempt: int | None = None
    #: The error that failed (or parked) the delivery.
    error: BaseException | None = None


def _trace_id(traceparent: Any) -> str | None:
    parts = str(traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


@contextlib.contextmanager
def delivery(actor: str, message: Any) -> Iterator[Seen]:
    """Observe one delivery of ``message`` to the step ``actor``; yields what to fill in."""
    seen = Seen()
    options = message.options
    saga_id = options.get("saga_id")
    trace_id = _trace_id(options.get("traceparent"))
    context = logs.Delivery(actor, str(message.message_id), str(saga_id) if saga_id else None, trace_id)
    started = time.perf_counter()
    with logs.processing(context), tracing.processing(actor, message) as span:
        try:
            yield seen
        except BaseException as exc:
            seen.outcome, seen.error = "error", exc
            raise
        finally:
            tracing.processed(span, seen.outcome, seen.attempt, seen.error)
            metrics.observe_delivery(actor, seen.outcome, time.perf_counter() - started)
