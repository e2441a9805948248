"""One order, one trace, across processes: `estafeta orders place`, the order system's workers, `estafeta relay`.

Every process runs under `opentelemetry-instrument` (the SDK and the OTLP/HTTP exporter
configured from OTEL_* variables, as the README tells users) and exports to a receiver the
test runs, on RabbitMQ. The order's trace runs from the CLI's span through a ``create`` and a
``process`` span per message to the saga's last step, across two worker processes; the
relay's ``send`` spans link to every message of the trace. The workers and the relay log
JSON lines that carry the saga id and the same trace id.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..helpers import scalar, wait_until
from ..shop import seed
from . import processes
from .otlp import Receiver, Span, receiving

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def instrumented(env: dict[str, str], service: str, endpoint: str) -> dict[str, str]:
    """``env`` for a process exporting its spans over OTLP/HTTP to ``endpoint``."""
    return {
        **env,
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "ESTAFETA_LOG_FORMAT": "json",
    }


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


#: The steps whose workers' log lines must carry the saga's trace.
LOGGED = {"payments.charge_payment", "notifications.notify_customer"}


def _logged_steps(text: str, saga_id: str) -> set[str]:
    """The actors of the JSON log lines about ``saga_id`` (a line still being written is left for later)."""
    complete = text[: text.rfind("\n") + 1]
    return {line["actor"] for line in _json_lines(complete) if line.get("saga_id") == saga_id}


def _saga_trace(receiver: Receiver, saga_id: str) -> list[Span]:
    roots = [
        s for s in receiver.spans() if s.name == "orders place" and s.attributes.get("estafeta.saga.id") == saga_id
    ]
    return receiver.trace(roots[0].trace_id) if roots else []


def _complete(receiver: Receiver, saga_id: str) -> bool:
    trace = _saga_trace(receiver, saga_id)
    processed = [s for s in trace if s.name.startswith("process ")]
    return len(processed) == 8 and len([s for s in trace if s.name.startswith("create ")]) == 8


def test_one_order_is_one_trace_across_the_cli_the_workers_and_the_relay(
    database_url: str, amqp_url: str, runtime, conn, tmp_path: Path
) -> None:
    seed(runtime, {"ann": 10_000}, {"sku-o": 5})
    with receiving() as receiver:
        endpoint = f"http://127.0.0.1:{receiver.port}"
        env = processes.service_env(database_url, amqp_url)
        agent = str(processes.BIN / "opentelemetry-instrument")
        workers_argv = [
            agent,
            str(processes.BIN / "dramatiq"),
            "estafeta_actors",
            "--processes",
            "2",
            "--threads",
            "2",
            "-v",
        ]
        workers = processes.Process("workers", workers_argv, instrumented(env, "workers", endpoint), tmp_path)
        relay_argv = [agent, str(processes.BIN / "estafeta"), "--log-format", "json", "-vv", "relay"]
        relay = processes.Process("relay", relay_argv, instrumented(env, "relay", endpoint), tmp_path)
        with processes.running(workers, relay):
            place = [agent, str(processes.BIN / "estafeta"), "orders", "place", "--customer", "ann", "--sku", "sku-o"]
            done = subprocess.run(
                [*place, "--amount", "100", "--json"],
                cwd=processes.ROOT,
                env=instrumented(env, "estafeta_cli", endpoint),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            saga_id = json.loads(done.stdout)[0]["saga_id"]
            status = "SELECT status FROM orders.saga_order WHERE saga_id = %s"
            wait_until(lambda: scalar(conn, status, saga_id) == "completed", timeout=60, what="the saga's end")
            wait_until(lambda: _complete(receiver, saga_id), timeout=30, what="the saga's spans")
            # A worker process's lines reach the log through Dramatiq's main process: later than its spans.
            wait_until(lambda: _logged_steps(workers.output(), saga_id) >= LOGGED, timeout=30, what="the log lines")
            worker_log, relay_log = workers.output(), relay.output()
        trace = _saga_trace(receiver, saga_id)
        sends = [s for s in receiver.spans() if s.name.startswith("send")]

    by_id = {s.span_id: s for s in trace}
    (root,) = [s for s in trace if not s.parent_id]
    assert root.name == "orders place" and root.service == "estafeta_cli"
    processed = [s for s in trace if s.name.startswith("process ")]
    created = [s for s in trace if s.name.startswith("create ")]
    assert {s.service for s in processed} == {"workers"}
    for span in processed:
        parent = by_id[span.parent_id]
        assert parent.name.startswith("create ") and span.kind == "CONSUMER" and parent.kind == "PRODUCER"
        assert parent.attributes["messaging.message.id"] == span.attributes["messaging.message.id"]
        assert span.attributes["messaging.system"] == "rabbitmq"
        assert span.attributes["messaging.message.conversation_id"] == saga_id
        assert span.attributes["estafeta.step.outcome"] == "ok"
    for span in created:
        assert by_id[span.parent_id] is root or by_id[span.parent_id].name.startswith("process ")
    saga_steps = [s.attributes.get("estafeta.saga.step") for s in processed if s.name != "process orders"]
    assert saga_steps == ["charge_payment", "reserve_inventory", "notify_customer"]
    assert processed[-1].attributes["estafeta.step.actor"] == "orders.saga_order_reply"  # the saga's last step

    # The relay: its send spans are traces of their own, linked to every message of this one.
    linked = {link for span in sends for link in span.links}
    assert {(s.trace_id, s.span_id) for s in created} <= linked
    assert all(s.service == "relay" and s.kind == "CLIENT" and s.trace_id != root.trace_id for s in sends)

    # Logs: what the workers wrote while processing this saga's messages carries its trace.
    lines = [line for line in _json_lines(worker_log) if line.get("saga_id") == saga_id]
    assert _logged_steps(worker_log, saga_id) >= LOGGED
    assert {line["trace_id"] for line in lines} == {root.trace_id}
    assert _json_lines(relay_log) and all(line.startswith("{") for line in relay_log.splitlines() if line.strip())
