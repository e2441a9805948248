"""Traces on the StubBroker, recorded by the OpenTelemetry SDK's in-memory exporter.

An order placed as `estafeta orders place` places it is one trace: its root span, a
``create`` span per outbox row (the row stores its context), a ``process`` span per
delivery as the child of its message's ``create`` span, and the ``create`` spans of what
a step sends as children of its ``process`` span, down to the saga's last step. The
relay's ``send`` spans are traces of their own that link to every message they carry.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from estafeta import Outcome, Runtime, Watchdog, deliver
from estafeta.messaging.messages import new_traceparent
from estafeta.observability import tracing as tracing
from estafeta_actors import pingpong
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_actors.pingpong import Ping
from estafeta_cli.orders import _place
from tests.probe import SERVICE as probe

from . import spans
from .app import STEPS
from .helpers import message_for, scalar, wait_until
from .shop import saga, seed
from .steps import Explode


def _ping() -> Ping:
    return Ping(uuid.uuid4(), datetime.now(UTC))


def _trace(exporter: Any, trace_id: int) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


def _ended(conn: Any, saga_id: uuid.UUID) -> bool:
    return scalar(conn, "SELECT completed_at IS NOT NULL FROM orders.saga_order WHERE saga_id = %s", saga_id)


def test_one_order_is_one_trace_from_orders_place_to_the_last_saga_step(
    runtime: Runtime, conn, stub_broker, stub_worker, running_relay
) -> None:
    seed(runtime, {"ann": 10_000}, {"sku-t": 5})
    with spans.capture() as exporter:
        (placed,) = _place(runtime, [("ann", "sku-t", None)], 1, 700)
        wait_until(lambda: _ended(conn, placed.saga_id), what="the saga's end")
        # The last reply's process span ends just after the commit that ended the saga.
        wait_until(lambda: len(spans.named(exporter.get_finished_spans(), "process orders")) >= 4)
    assert saga(conn, placed.saga_id).status == "completed"
    (root,) = spans.named(exporter.get_finished_spans(), "orders place")
    assert root.parent is None and root.attributes["estafeta.saga.id"] == str(placed.saga_id)
    trace = _trace(exporter, root.context.trace_id)
    by_id = {s.context.span_id: s for s in trace}
    creates, processes = spans.named(trace, "create "), spans.named(trace, "process ")
    # charge, reserve, confirm, notify and the four replies: each written, each processed once.
    assert len(creates) == 8 and len(processes) == 8
    for process in processes:
        created = by_id[spans.parent_id(process)]
        assert created.name == "create " + process.attributes["messaging.destination.name"]
        assert created.attributes["messaging.message.id"] == process.attributes["messaging.message.id"]
        assert process.kind is SpanKind.CONSUMER and created.kind is SpanKind.PRODUCER
        assert process.attributes["messaging.message.conversation_id"] == str(placed.saga_id)
        assert process.attributes["estafeta.step.outcome"] == "ok"
        assert process.attributes["estafeta.inbox.duplicate"] is False
    for created in creates:
        parent = by_id[spans.parent_id(created)]
        # The first command under the CLI's span; every later one under the step that sent it.
        assert parent is root or parent.name.startswith("process ")
    steps = [p.attributes.get("estafeta.saga.step") for p in processes if p.name != "process orders"]
    assert steps == ["charge_payment", "reserve_inventory", "notify_customer"]
    actors = {p.attributes["estafeta.step.actor"] for p in processes}
    assert actors == {
        "payments.charge_payment",
        "inventory.reserve_stock",
        "orders.confirm_order",
        "notifications.notify_customer",
        "orders.saga_order_reply",
    }


def test_the_relay_send_span_links_to_every_message_of_its_batch(runtime: Runtime, conn, stub_broker, relay) -> None:
    with spans.capture() as exporter:
        with runtime.database("pingpong").transaction() as tx:
            for _ in range(3):
                with tracing.span("a caller"):
                    pingpong.SERVICE.send(tx, _ping())
        assert relay.drain_once() == 3
        finished = exporter.get_finished_spans()
    (send,) = spans.named(finished, "send")
    creates = spans.named(finished, "create ")
    assert send.name == "send pingpong" and send.kind is SpanKind.CLIENT
    assert send.attributes["messaging.batch.message_count"] == 3
    assert send.attributes["estafeta.outbox.confirmed"] == 3
    assert send.parent is None
    linked = {(link.context.trace_id, link.context.span_id) for link in send.links}
    assert linked == {(c.context.trace_id, c.context.span_id) for c in creates}
    assert len({c.context.trace_id for c in creates}) == 3  # three callers, three traces


def test_the_outbox_row_stores_the_create_spans_context(runtime: Runtime, conn) -> None:
    with spans.capture() as exporter, runtime.database("pingpong").transaction() as tx:
        message_id = pingpong.SERVICE.send(tx, _ping())
    (create,) = spans.named(exporter.get_finished_spans(), "create ")
    options = scalar(conn, "SELECT message -> 'options' FROM pingpong.outbox WHERE message_id = %s", message_id)
    context = create.context
    _, trace_id, span_id, flags = options["traceparent"].split("-")
    assert (trace_id, span_id) == (spans.hex_id(context.trace_id), spans.hex_id(context.span_id, 16))
    assert int(flags, 16) & 1  # sampled
    assert create.attributes["messaging.operation.type"] == "create"
    assert create.attributes["messaging.system"] == "dramatiq_stub"
    assert create.attributes["messaging.destination.name"] == "pingpong"
    assert create.attributes["messaging.message.id"] == str(message_id)


def test_each_retry_is_a_process_span_of_its_own_under_the_same_create_span(
    runtime: Runtime, conn, stub_broker, stub_worker, running_relay
) -> None:
    ping_id = uuid.uuid4()
    with spans.capture() as exporter:
        with runtime.database("probe").transaction() as tx, tracing.span("a caller"):
            probe.send(tx, Explode(ping_id, times=1))
        wait_until(lambda: len(spans.named(exporter.get_finished_spans(), "process probe")) == 2)
        finished = exporter.get_finished_spans()
    first, second = spans.named(finished, "process probe")
    (create,) = spans.named(finished, "create probe")
    assert spans.parent_id(first) == spans.parent_id(second) == create.context.span_id
    assert first.context.span_id != second.context.span_id
    assert (first.attributes["estafeta.delivery.retries"], second.attributes["estafeta.delivery.retries"]) == (0, 1)
    assert first.status.status_code is StatusCode.ERROR and first.attributes["error.type"] == "RuntimeError"
    assert first.attributes["estafeta.step.outcome"] == "error"
    assert second.status.status_code is not StatusCode.ERROR
    assert second.attributes["estafeta.step.outcome"] == "ok"
    assert second.attributes["estafeta.delivery.attempt"] == 2


def test_a_duplicate_delivery_and_a_parked_message_say_so_on_their_spans(runtime: Runtime, conn, stub_broker) -> None:
    spec = STEPS["pingpong.ping"]
    message = message_for(spec.actor_name, _ping(), traceparent=new_traceparent())
    bad = message_for(spec.actor_name, _ping()).copy(args=({"not": "a ping"},))
    with spans.capture() as exporter:
        assert deliver(spec, runtime, message) is Outcome.OK
        assert deliver(spec, runtime, message) is Outcome.DUPLICATE
        assert deliver(spec, runtime, bad) is Outcome.DEAD_LETTERED
        first, again, parked = spans.named(exporter.get_finished_spans(), "process ")
    assert first.attributes["estafeta.inbox.duplicate"] is False
    assert again.attributes["estafeta.inbox.duplicate"] is True
    assert again.attributes["estafeta.step.outcome"] == "duplicate"
    assert first.context.trace_id == again.context.trace_id == int(message.options["traceparent"].split("-")[1], 16)
    assert parked.status.status_code is StatusCode.ERROR
    assert parked.attributes["estafeta.step.outcome"] == "dead_lettered"


def test_a_replay_starts_a_new_trace_linked_to_the_original(runtime: Runtime, conn) -> None:
    original = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with spans.capture() as exporter:
        with (
            tracing.span("an operator's command"),
            tracing.replaying("replay pingpong", original),
            runtime.database("pingpong").transaction() as tx,
        ):
            pingpong.SERVICE.send(tx, _ping())
        finished = exporter.get_finished_spans()
    (replay,) = spans.named(finished, "replay ")
    (create,) = spans.named(finished, "create ")
    assert replay.parent is None and spans.parent_id(create) == replay.context.span_id
    assert replay.context.trace_id != 0x0AF7651916CD43DD8448EB211C80319C
    (link,) = replay.links
    assert (link.context.trace_id, link.context.span_id) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)


def test_a_dead_letter_replay_is_a_new_trace_linked_to_where_the_message_was_created(runtime: Runtime, conn) -> None:
    from estafeta.operations.dead_letter_replay import replay
    from tests.app import app as tests_app

    from .lock_steps import open_account
    from .steps import Settle

    order_id = uuid.uuid4()
    created = new_traceparent()
    message = message_for(
        "probe.test_settle", Settle(order_id), retries=runtime.settings.max_retries, traceparent=created
    )
    assert deliver(STEPS["probe.test_settle"], runtime, message) is Outcome.DEAD_LETTERED
    open_account(conn, order_id)
    with spans.capture() as exporter:
        (replayed,) = replay(runtime, tests_app, ["probe"])
        finished = exporter.get_finished_spans()
    assert replayed.outcome == "replayed"
    (root,) = spans.named(finished, "replay probe")
    (create,) = spans.named(finished, "create probe")
    assert root.parent is None and spans.parent_id(create) == root.context.span_id
    original_trace = int(created.split("-")[1], 16)
    assert root.context.trace_id != original_trace
    (link,) = root.links
    assert (link.context.trace_id, link.context.span_id) == (original_trace, int(created.split("-")[2], 16))
    stored = scalar(conn, "SELECT message #>> '{options,traceparent}' FROM probe.outbox")
    assert stored.split("-")[1] == f"{create.context.trace_id:032x}"
    assert stored.split("-")[2] == f"{create.context.span_id:016x}"


@pytest.mark.parametrize("with_parent", [True, False])
def test_without_a_recording_span_rows_still_carry_a_traceparent(runtime: Runtime, conn, with_parent: bool) -> None:
    parent = new_traceparent() if with_parent else None
    with runtime.database("pingpong").transaction() as tx:
        message_id = pingpong.SERVICE.send(tx, _ping(), traceparent=parent)
    traceparent = scalar(
        conn, "SELECT message #>> '{options,traceparent}' FROM pingpong.outbox WHERE message_id = %s", message_id
    )
    assert traceparent.startswith("00-") and len(traceparent) == 55
    if parent:
        assert traceparent.split("-")[1] == parent.split("-")[1] and traceparent != parent


WITHOUT_OPENTELEMETRY = """
import sys, time
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from dramatiq.brokers.stub import StubBroker
from estafeta_actors import pingpong
from estafeta_brokers import tracing
from estafeta import Runtime, Settings, running
from tests.app import app
assert not tracing.enabled()
runtime = Runtime(Settings(database_url=sys.argv[1]))
with running(app.bind(StubBroker(), runtime)):
    with runtime.database("pingpong").transaction() as conn:
        ping_id = pingpong.send_ping(conn)
    for _ in range(200):
        with runtime.database("pingpong").connection() as conn:
            if pingpong.ping_status(conn, ping_id)[0]:
                break
        time.sleep(0.05)
    with runtime.database("pingpong").connection() as conn:
        print(pingpong.ping_status(conn, ping_id), "opentelemetry" in sys.modules and sys.modules["opentelemetry"])
"""


def test_estafeta_works_without_opentelemetry_installed(database_url: str, runtime: Runtime) -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENTELEMETRY, database_url],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(True, 1) None"


def test_a_command_the_watchdog_sends_again_is_in_a_saga_deadline_trace(runtime: Runtime, conn) -> None:
    seed(runtime, {"ann": 10_000}, {"sku-w": 5})
    (placed,) = _place(runtime, [("ann", "sku-w", None)], 1, 100)
    # The charge was published (its row is gone) and nobody answered before the deadline.
    conn.execute("DELETE FROM orders.outbox")
    conn.execute(
        "UPDATE orders.saga_order SET deadline_at = now() - interval '1 s' WHERE saga_id = %s", (placed.saga_id,)
    )
    with spans.capture() as exporter:
        assert Watchdog(runtime, [ORDER_SAGA]).check_once()["resent"] == 1
        finished = exporter.get_finished_spans()
    (deadline,) = spans.named(finished, "saga deadline order")
    (create,) = spans.named(finished, "create payments")
    assert deadline.parent is None and deadline.attributes["estafeta.saga.id"] == str(placed.saga_id)
    assert spans.parent_id(create) == deadline.context.span_id
