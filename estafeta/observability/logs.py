"""Log lines that say which message they were written for: actor, message id, saga id, trace id.

While a step processes a message, :func:`processing` keeps what identifies the delivery
in a context variable (one per worker thread). :class:`ContextFilter`, set on a handler,
copies it onto every record that handler writes, whichever logger wrote it (the step's
own code, estafeta's, psycopg's): no call site formats it in. The text format appends it
to the line, the JSON format writes it as fields. Nothing else of a message reaches a log
line, never its payload.

``dramatiq`` worker processes get the filter (and ``ESTAFETA_LOG_FORMAT``) on the
handlers Dramatiq set up (:func:`adopt_handlers`, called at worker boot); the
``estafeta`` command installs its own (:func:`configure`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import attrs

from estafeta_brokers import tracing

#: The fields a record gets while a message is processed (``None`` otherwise).
FIELDS = ("actor", "message_id", "saga_id", "trace_id", "span_id")
#: The ``estafeta`` command's text format (the context is appended to it).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@attrs.frozen
class Delivery:
    """What identifies the message being processed, for log lines."""

    actor: str
    message_id: str
    saga_id: str | None = None
    trace_id: str | None = None


_CURRENT: ContextVar[Delivery | None] = ContextVar("estafeta_delivery", default=None)


@contextlib.contextmanager
def processing(delivery: Delivery) -> Iterator[None]:
    """Mark every log line written in this block (in this thread) with ``delivery``."""
    token = _CURRENT.set(delivery)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Delivery | None:
    """The delivery being processed by this thread, if any."""
    return _CURRENT.get()


class ContextFilter(logging.Filter):
    """Sets :data:`FIELDS` on every record: the delivery's, and the current span's ids.

    The trace and span ids come from the current OpenTelemetry span when one is recording
    (so lines written under the CLI's or the relay's spans carry them too), else from the
    message's ``traceparent``. Always returns ``True``: it annotates, it never drops.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        delivery = _CURRENT.get()
        trace_id, span_id = tracing.current_ids()
        record.actor = delivery.actor if delivery else None
        record.message_id = delivery.message_id if delivery else None
        record.saga_id = delivery.saga_id if delivery else None
        record.trace_id = trace_id or (delivery.trace_id if delivery else None)
        record.span_id = span_id
        return True


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {name: value for name in FIELDS if (value := getattr(record, name, None))}


class TextFormatter(logging.Formatter):
    """A plain text line; while a message is processed, ``[actor=... saga_id=...]`` follows the message."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        context = _context(record)
        if not context:
            return line
        return line + " [" + " ".join(f"{name}={value}" for name, value in context.items()) + "]"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, message, process, thread, the context fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
            **_context(record),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str)


def formatter(log_format: str, text_format: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter for ``log_format`` (``text`` or ``json``)."""
    return JsonFormatter() if log_format == "json" else TextFormatter(text_format)


def configure(level: int, log_format: str = "text") -> None:
    """The ``estafeta`` command's logging: one stderr handler with the context filter.

    Like ``logging.basicConfig``, it does nothing if the root logger already has handlers
    (an embedding application's, or a test runner's).
    """
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])


#: pika's loggers that report one failed connection (refused, lost, or its login refused) in five
#: to seven lines at ERROR; estafeta's relay, workers and commands report each failure in one
#: line of their own, so these speak only of what is worse (nothing pika logs today).
PIKA_CONNECTION_LOGGERS = (
    "pika.adapters.utils.io_services_utils",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.base_connection",
    "pika.adapters.blocking_connection",
    "pika.connection",
)


def quiet_pika(level: int = logging.WARNING) -> None:
    """Leave connection failures to estafeta's one line each: pika's connection loggers at CRITICAL.

    At ``logging.DEBUG`` (``-vv``) pika is left to say everything. Its other loggers log no
    lower than WARNING (their timers log at DEBUG).
    """
    if level <= logging.DEBUG:
        return
    logging.getLogger("pika").setLevel(max(level, logging.WARNING))
    for name in PIKA_CONNECTION_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def adopt_handlers(log_format: str, handlers: Iterable[logging.Handler] | None = None) -> None:
    """Give ``handlers`` (the root logger's) the context filter and ``log_format``.

    For ``dramatiq`` worker processes, whose handlers Dramatiq sets up before estafeta
    runs: the text format keeps the handler's own format string and appends the context.
    """
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(f, ContextFilter) for f in handler.filters):
            handler.addFilter(ContextFilter())
        if isinstance(handler.formatter, TextFormatter | JsonFormatter):
            continue
        current = handler.formatter
        text_format = getattr(current, "_fmt", None) or TEXT_FORMAT
        handler.setFormatter(formatter(log_format, text_format))
