"""OpenTelemetry, if it is installed: the relay's ``send`` spans and the W3C trace context of messages.

Only the ``opentelemetry-api`` package is used (``pip install 'estafeta[otel]'``); without
it every function here does nothing and everything else behaves the same. Spans are
recorded once the application configures an SDK and an exporter (for instance by running
``opentelemetry-instrument estafeta relay``).

A message carries its *creation context* in its options, as W3C ``traceparent`` (and
``tracestate``): the context of the ``create`` span that wrote its outbox row. The relay
publishes a batch under one ``send`` span (kind CLIENT, as the messaging conventions ask
when the messages have creation contexts of their own) that links to every message's
creation context; it does not change the messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace as otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: every span below is skipped
    otel = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext

    from estafeta_sql.outbox import OutboxRow

#: The instrumentation scope of every span estafeta makes.
TRACER_NAME = "estafeta"
#: ``messaging.system`` of Dramatiq brokers, by class name (others: the class name, lower-cased, less "broker").
_SYSTEMS = {"RabbitmqBroker": "rabbitmq", "RedisBroker": "redis", "StubBroker": "dramatiq_stub"}

_PROPAGATOR = TraceContextTextMapPropagator() if TraceContextTextMapPropagator is not None else None


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is installed (spans are still no-ops without an SDK)."""
    return otel is not None


def messaging_system(broker: object) -> str:
    """The ``messaging.system`` attribute for a Dramatiq broker: ``rabbitmq``, ``redis``...

    A subclass of a known broker (estafeta's own RabbitMQ broker) is what it extends.
    """
    known = next((_SYSTEMS[cls.__name__] for cls in type(broker).__mro__ if cls.__name__ in _SYSTEMS), None)
    return known or type(broker).__name__.lower().removesuffix("broker") or "dramatiq"


def span_context(options: Mapping[str, Any]) -> SpanContext | None:
    """The creation context carried by a message's options, if it has a valid one."""
    if otel is None or _PROPAGATOR is None or not options.get("traceparent"):
        return None
    carrier = {key: str(options[key]) for key in ("traceparent", "tracestate") if options.get(key)}
    found = otel.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return found if found.is_valid else None


def inject(carrier: dict[str, str]) -> None:
    """Write the current span's context into ``carrier`` (``traceparent``, ``tracestate``)."""
    if _PROPAGATOR is not None:
        _PROPAGATOR.inject(carrier)


def extract(carrier: Mapping[str, str]) -> Any:
    """The OpenTelemetry context whose parent is ``carrier``'s ``traceparent`` (``None`` without the API)."""
    return _PROPAGATOR.extract(dict(carrier)) if _PROPAGATOR is not None else None


def current_ids() -> tuple[str | None, str | None]:
    """The trace and span ids (hex) of the current span, if one is recording."""
    if otel is None:
        return None, None
    span = otel.get_current_span()
    found = span.get_span_context()
    if not found.is_valid or not span.is_recording():
        return None, None
    return format(found.trace_id, "032x"), format(found.span_id, "016x")


@contextlib.contextmanager
def sending(service: str, rows: Sequence[OutboxRow], system: str) -> Iterator[Span | None]:
    """The ``send`` span of one relay batch, linked to each row's creation context.

    Named ``send <queue>`` when every row goes to one queue, ``send`` otherwise. Links are
    added only when the span records (the SDK keeps 128 per span unless configured).
    """
    if otel is None:
        yield None
        return
    queues = {row.queue_name for row in rows}
    name = f"send {next(iter(queues))}" if len(queues) == 1 else "send"
    attributes: dict[str, Any] = {
        "messaging.system": system,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.batch.message_count": len(rows),
        "estafeta.outbox.service": service,
    }
    if len(queues) == 1:
        attributes["messaging.destination.name"] = next(iter(queues))
    tracer = otel.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, kind=otel.SpanKind.CLIENT, attributes=attributes) as span:
        if span.is_recording():
            for row in rows:
                created = span_context(row.message.get("options", {}))
                if created is not None:
                    span.add_link(created, {"messaging.message.id": str(row.message_id)})
        yield span


def sent(span: Span | None, confirmed: int, refused: int, broker_error: str | None) -> None:
    """Record on a ``send`` span what the broker confirmed; an outage or a refusal is an error."""
    if span is None or otel is None or not span.is_recording():
        return
    span.set_attribute("estafeta.outbox.confirmed", confirmed)
    span.set_attribute("estafeta.outbox.refused", refused)
    if broker_error is not None:
        span.set_attribute("error.type", "broker_unavailable")
        span.set_status(otel.Status(otel.StatusCode.ERROR, broker_error))
    elif refused:
        span.set_attribute("error.type", "publish_refused")
        span.set_status(otel.Status(otel.StatusCode.ERROR, f"the broker refused {refused} message(s)"))
