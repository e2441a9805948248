"""What tracing costs a step: outbox writes and deliveries without OpenTelemetry, with the API only, with the SDK.

Each mode runs in a process of its own (so ``opentelemetry`` is imported, or not, as in
production) on a scratch database: ``--count`` transactions that write one ping to the
outbox (one ``create`` span each), then ``--count`` deliveries of those pings to the ping
step (a ``process`` span, the step's insert and its pong's ``create`` span). The SDK mode
records every span with a batch processor and an exporter that drops them, so the figure
is the instrumentation's cost, not a collector's. The baseline is the first line: no
``opentelemetry`` package at all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from .common import add_database_url, describe, machine, scratch_database

MODES = ("none", "api", "sdk")


def _prepare_mode(mode: str) -> None:
    if mode == "none":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # as if the extra were not installed
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Dropping(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
        trace.set_tracer_provider(provider)


def measure(mode: str, dsn: str, count: int) -> dict[str, Any]:
    """Run one mode in this process: microseconds per outbox write and per delivery."""
    _prepare_mode(mode)
    import dramatiq

    from estafeta import Runtime, Settings, deliver
    from estafeta_actors import pingpong
    from estafeta_actors.app import app

    runtime = Runtime(Settings(database_url=dsn))
    spec = app.steps["pingpong.ping"]
    database = runtime.database("pingpong")
    started = time.perf_counter()
    for _ in range(count):
        with database.transaction() as conn:
            pingpong.SERVICE.send(conn, pingpong.Ping(uuid.uuid4(), datetime.now(UTC)))
    send_us = (time.perf_counter() - started) / count * 1e6
    with database.transaction() as conn:
        rows = conn.execute("DELETE FROM pingpong.outbox RETURNING message_id, message").fetchall()
    messages = [
        dramatiq.Message(
            queue_name="pingpong",
            actor_name=spec.actor_name,
            args=tuple(body["args"]),
            kwargs={},
            options=body["options"],
            message_id=str(message_id),
        )
        for message_id, body in rows
    ]
    started = time.perf_counter()
    for message in messages:
        deliver(spec, runtime, message)
    deliver_us = (time.perf_counter() - started) / len(messages) * 1e6
    runtime.close()
    return {"mode": mode, "send_us": send_us, "deliver_us": deliver_us, **_instrumentation_only(messages[0])}


def _instrumentation_only(message: Any, count: int = 20000) -> dict[str, float]:
    """Microseconds the instrumentation alone takes per outbox write and per delivery (no database)."""
    from estafeta.observability import delivery as observe
    from estafeta.observability import tracing as tracing

    message_id = uuid.uuid4()
    started = time.perf_counter()
    for _ in range(count):
        with tracing.creating("pingpong", "pingpong.ping", message_id, None, message.options["traceparent"]):
            pass
    create_us = (time.perf_counter() - started) / count * 1e6
    started = time.perf_counter()
    for _ in range(count):
        with observe.delivery("pingpong.ping", message) as seen:
            seen.outcome = "ok"
    process_us = (time.perf_counter() - started) / count * 1e6
    return {"create_span_us": create_us, "process_span_us": process_us}


def _migrate(dsn: str) -> None:
    from estafeta import Runtime, Settings
    from estafeta_actors.app import app

    runtime = Runtime(Settings(database_url=dsn))
    runtime.migrate([app.service("pingpong")])
    runtime.close()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for mode in MODES:
        with scratch_database(args.database_url, _migrate) as dsn:
            argv = [sys.executable, "-m", "bench.observe", "--child", mode, "--dsn", dsn, "--count", str(args.count)]
            done = subprocess.run(argv, capture_output=True, text=True, check=True, env={**os.environ})
            results.append(json.loads(done.stdout))
    return results


def table(results: list[dict[str, Any]], count: int) -> str:
    base = results[0]
    lines = [
        f"{'OpenTelemetry':<28}{'outbox write us':>16}{'vs none':>9}{'delivery us':>13}{'vs none':>9}"
        f"{'create (instr.) us':>20}{'process (instr.) us':>21}"
    ]
    names = {"none": "not installed (baseline)", "api": "API only, no SDK", "sdk": "SDK, every span recorded"}
    for r in results:
        lines.append(
            f"{names[r['mode']]:<28}{r['send_us']:>16.0f}{r['send_us'] / base['send_us']:>9.0%}"
            f"{r['deliver_us']:>13.0f}{r['deliver_us'] / base['deliver_us']:>9.0%}"
            f"{r['create_span_us']:>20.1f}{r['process_span_us']:>21.1f}"
        )
    lines.append(
        "outbox write and delivery: whole transactions (commit included); (instr.): the instrumentation"
        " alone, without the database (metrics and log context included in process)"
    )
    lines.append(f"\n{count} writes and deliveries per mode; {describe(machine())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="writes and deliveries per mode (default 2000)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_database_url(parser)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.dsn, args.count)))
        return
    results = run(args)
    if args.json:
        json.dump({"machine": machine(), "count": args.count, "results": results}, sys.stdout, indent=2)
        print()
    else:
        print(table(results, args.count))


if __name__ == "__main__":
    main()
