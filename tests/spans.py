"""Capturing the spans estafeta makes, with the OpenTelemetry SDK's in-memory exporter.

The SDK's tracer provider is global and can be set once per process, so one provider is
installed for the whole test run; its sampler records spans only while a test captures
(other tests' spans are dropped before they cost anything), and :func:`capture` clears
what the previous capture kept.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

_EXPORTER = InMemorySpanExporter()
_lock = threading.Lock()
_installed = False


class _WhileCapturing(Sampler):
    """Records every span while a test captures, none otherwise."""

    active = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        # The span keeps the attributes the sampler passes on, so pass them all on.
        if not self.active:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "while-capturing"


_SAMPLER = _WhileCapturing()


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            provider = TracerProvider(sampler=_SAMPLER)
            provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
            trace.set_tracer_provider(provider)
            _installed = True


@contextlib.contextmanager
def capture() -> Iterator[InMemorySpanExporter]:
    """Record every span made in this block; yields the exporter holding them."""
    _install()
    _EXPORTER.clear()
    _SAMPLER.active = True
    try:
        yield _EXPORTER
    finally:
        _SAMPLER.active = False


def hex_id(value: int, width: int = 32) -> str:
    """A trace (32) or span (16) id as W3C hex."""
    return format(value, f"0{width}x")


def parent_id(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent, if it has one."""
    return span.parent.span_id if span.parent is not None else None


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with ``prefix``, in start order."""
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)
