"""Spans of estafeta's messages, following OpenTelemetry's messaging conventions.

- ``create <queue>`` (PRODUCER) when a message is written to an outbox: its context is
  what the row stores (``traceparent`` in the message's options), so the consumer and the
  relay see where each message was created, however the relay batches them.
- ``send [<queue>]`` (CLIENT), the relay's batch, linked to every message it carries
  (:mod:`estafeta_brokers.tracing`).
- ``process <queue>`` (CONSUMER), one per delivery attempt of a message to a step, a child
  of the message's creation context (the conventions allow it for single messages, and
  document it): the trace of an order runs from its placement to its saga's last step.

Only ``opentelemetry-api`` is used, and only if it is installed. Without it, or without an
SDK, no span is recorded but every message still gets a ``traceparent``: a new span id in
its parent's trace, so log lines keep one trace id per saga.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from estafeta.messaging.messages import new_traceparent
from estafeta_brokers import tracing

try:
    from opentelemetry import trace as otel
except ImportError:  # the otel extra is not installed: no spans, traceparents still written
    otel = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span

#: ``messaging.system`` of the broker this process binds its app to (set by ``App.bind``).
_system = "dramatiq"


def use_messaging_system(name: str) -> None:
    """Name the broker this process's spans report (``rabbitmq``, ``redis``...); ``App.bind`` calls it."""
    global _system
    _system = name


def _message_attributes(operation: str, queue: str, message_id: str, saga_id: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": _system,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.destination.name": queue,
        "messaging.message.id": message_id,
    }
    if saga_id:
        attributes["messaging.message.conversation_id"] = str(saga_id)
    return attributes


def _parent(traceparent: str | None) -> Any:
    """The parent of a ``create`` span: the current span if any, else ``traceparent``, else none (a new trace)."""
    assert otel is not None
    if otel.get_current_span().get_span_context().is_valid or not traceparent:
        return None
    return tracing.extract({"traceparent": traceparent})


@contextlib.contextmanager
def creating(
    queue: str, actor: str, message_id: uuid.UUID, saga_id: uuid.UUID | None, traceparent: str | None
) -> Iterator[dict[str, str]]:
    """The ``create`` span of one outbox row; yields the trace context options to store with it.

    The span is a child of the current span (a step's ``process`` span, the CLI's), or of
    ``traceparent`` when no span is current. The options yielded are the span's own context;
    when no span records, a new span id in ``traceparent``'s trace.
    """
    fallback = {"traceparent": new_traceparent(traceparent)}
    if otel is None:
        yield fallback
        return
    parent = _parent(traceparent)
    attributes = {**_message_attributes("create", queue, str(message_id), saga_id), "estafeta.step.actor": actor}
    above = otel.get_current_span(parent).get_span_context()
    tracer = otel.get_tracer(tracing.TRACER_NAME)
    with tracer.start_as_current_span(
        f"create {queue}", context=parent, kind=otel.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        made = span.get_span_context()
        if not made.is_valid or made.span_id == above.span_id:
            # No SDK: the API hands back the parent. Keep today's traceparent instead.
            yield fallback
            return
        carrier: dict[str, str] = {}
        tracing.inject(carrier)
        yield carrier


def _saga_step(message_options: Mapping[str, Any], args: Any) -> Mapping[str, Any]:
    """The saga context a message answers or asks for: a command's ``reply_to``, a reply's own."""
    reply_to = message_options.get("reply_to")
    if isinstance(reply_to, Mapping) and isinstance(reply_to.get("context"), Mapping):
        return reply_to["context"]  # type: ignore[no-any-return]
    first = args[0] if args else None
    if isinstance(first, Mapping) and isinstance(first.get("context"), Mapping) and "in_reply_to" in first:
        return first["context"]  # type: ignore[no-any-return]
    return {}


@contextlib.contextmanager
def processing(actor: str, message: Any) -> Iterator[Span | None]:
    """The ``process`` span of one delivery attempt, current while the step runs.

    Its parent is the message's creation context; the actor, the saga, its step and the
    Dramatiq retry count are attributes; :func:`processed` adds the outcome.
    """
    if otel is None:
        yield None
        return
    options = dict(message.options)
    attributes = _message_attributes("process", message.queue_name, str(message.message_id), options.get("saga_id"))
    attributes["estafeta.step.actor"] = actor
    attributes["estafeta.delivery.retries"] = int(options.get("retries", 0))
    saga = _saga_step(options, message.args)
    for key in ("saga", "step", "direction"):
        if saga.get(key):
            attributes[f"estafeta.saga.{key}"] = str(saga[key])
    carrier = {key: str(options[key]) for key in ("traceparent", "tracestate") if options.get(key)}
    parent = tracing.extract(carrier) if carrier else None
    tracer = otel.get_tracer(tracing.TRACER_NAME)
    with tracer.start_as_current_span(
        f"process {message.queue_name}",
        context=parent,
        kind=otel.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


def processed(span: Span | None, outcome: str, attempt: int | None, error: BaseException | None) -> None:
    """Record a delivery's outcome on its ``process`` span; a parked or failed delivery is an error."""
    if span is None or otel is None or not span.is_recording():
        return
    span.set_attribute("estafeta.step.outcome", str(outcome))
    span.set_attribute("estafeta.inbox.duplicate", outcome == "duplicate")
    if attempt is not None:
        span.set_attribute("estafeta.delivery.attempt", attempt)
    if error is not None:
        span.set_attribute("error.type", type(error).__qualname__)
    if outcome == "dead_lettered":
        span.set_attribute("error.type", type(error).__qualname__ if error else "dead_lettered")
        span.set_status(otel.Status(otel.StatusCode.ERROR, "dead-lettered"))


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Span | None]:
    """An INTERNAL span, current in the block (``orders place``, a watchdog pass), or nothing without the API."""
    if otel is None:
        yield None
        return
    tracer = otel.get_tracer(tracing.TRACER_NAME)
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


@contextlib.contextmanager
def replaying(name: str, original_options: Mapping[str, Any], **attributes: Any) -> Iterator[Span | None]:
    """A new trace for a replayed message, linked to its original creation context.

    A dead-letter replay sends the message again inside this block: the new ``create``
    span is a child of this span (a root, never of the original trace), and the link
    leads back to where the message was first created.
    """
    if otel is None:
        yield None
        return
    from opentelemetry import context as otel_context

    original = tracing.span_context(original_options)
    links = [otel.Link(original, {"estafeta.link": "replay_of"})] if original is not None else []
    tracer = otel.get_tracer(tracing.TRACER_NAME)
    root = otel_context.Context()  # not a child of whatever is current: a new trace
    with tracer.start_as_current_span(name, context=root, links=links, attributes=attributes) as current:
        yield current
