"""Metrics of steps and sagas, and the gauges read from the tables when Prometheus scrapes.

Counters are read from prometheus_client's registry before and after (other tests in
the run count too); the table gauges from a collector over this test's database.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from estafeta import Clock, Outcome, Runtime, Watchdog, deliver
from estafeta.observability.table_metrics import SagaKind, TablesCollector
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_actors.pingpong import Pong
from estafeta_brokers.outboxes import Outbox

from .app import STEPS
from .helpers import message_for
from .shop import Courier, place, saga, seed


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _gauges(runtime: Runtime, stuck_after: float) -> dict[tuple[str, tuple[str, ...]], float]:
    """Every gauge the tables collector reports now, by name and label values."""
    collector = TablesCollector(
        [Outbox(name, runtime.database(name)) for name in ("orders", "payments", "pingpong")],
        [SagaKind("order", ORDER_SAGA.table, runtime.database("orders"))],
        stuck_after,
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (sample.name, tuple(sample.labels.values())): sample.value
        for family in registry.collect()
        for sample in family.samples
    }


def test_a_saga_counts_as_stuck_when_its_state_stays_put_and_a_resend_is_no_progress(runtime: Runtime, conn) -> None:
    clock = Clock(runtime, ["orders"])
    seed(runtime, {"ann": 10_000}, {"sku-m": 5})
    first = place(runtime, "ann", "sku-m", 1, 100, step_timeout=30)
    second = place(runtime, "ann", "sku-m", 1, 100, step_timeout=30)
    gauges = _gauges(runtime, stuck_after=60)
    assert gauges[("estafeta_sagas", ("order", "running"))] == 2
    assert gauges[("estafeta_sagas", ("order", "completed"))] == 0
    assert gauges[("estafeta_sagas_stuck", ("order",))] == 0
    clock.advance(timedelta(seconds=31))
    assert Watchdog(runtime, [ORDER_SAGA]).check_once()["resent"] == 2  # no participant answers
    assert saga(conn, first.saga_id).attempts == 2
    assert _gauges(runtime, stuck_after=60)[("estafeta_sagas_stuck", ("order",))] == 0
    clock.advance(timedelta(seconds=30))
    gauges = _gauges(runtime, stuck_after=60)
    assert gauges[("estafeta_sagas_stuck", ("order",))] == 2  # re-sent, still in one state
    assert gauges[("estafeta_saga_longest_wait_seconds", ("order",))] >= 61
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.abort(tx, second.saga_id, "the test moves it on")
    gauges = _gauges(runtime, stuck_after=60)
    assert gauges[("estafeta_sagas_stuck", ("order",))] == 1
    assert gauges[("estafeta_sagas", ("order", "compensating"))] == 1


def test_dead_letters_are_counted_per_service_from_the_table(runtime: Runtime, conn) -> None:
    spec = STEPS["pingpong.ping"]
    bad = message_for(spec.actor_name, Pong(uuid.uuid4())).copy(args=({"not": "a ping"},))
    assert deliver(spec, runtime, bad) is Outcome.DEAD_LETTERED
    gauges = _gauges(runtime, stuck_after=60)
    assert gauges[("estafeta_dead_letters", ("pingpong",))] == 1
    assert gauges[("estafeta_dead_letters", ("payments",))] == 0


def test_a_compensated_saga_counts_its_compensations_transitions_steps_and_lock_waits(runtime: Runtime, conn) -> None:
    seed(runtime, {"bob": 50}, {"sku-n": 5})
    placed = place(runtime, "bob", "sku-n", 1, 700)  # more than bob has: the charge is refused
    before: dict[str, Any] = {
        "compensations": _sample("estafeta_saga_compensation_total", saga="order", step="place_order"),
        "compensated": _sample("estafeta_saga_transitions_total", saga="order", status="compensated"),
        "refused": _sample("estafeta_step_deliveries_total", actor="payments.charge_payment", outcome="failed"),
        "durations": _sample("estafeta_step_duration_seconds_count", actor="payments.charge_payment"),
        "lock_waits": _sample("estafeta_lock_wait_seconds_count", actor="payments.charge_payment"),
        "notices": _sample("estafeta_saga_compensation_total", saga="order", step="notify_cancellation"),
    }
    Courier(runtime, conn).run()
    assert saga(conn, placed.saga_id).status == "compensated"
    after = {
        "compensations": _sample("estafeta_saga_compensation_total", saga="order", step="place_order"),
        "compensated": _sample("estafeta_saga_transitions_total", saga="order", status="compensated"),
        "refused": _sample("estafeta_step_deliveries_total", actor="payments.charge_payment", outcome="failed"),
        "durations": _sample("estafeta_step_duration_seconds_count", actor="payments.charge_payment"),
        "lock_waits": _sample("estafeta_lock_wait_seconds_count", actor="payments.charge_payment"),
        "notices": _sample("estafeta_saga_compensation_total", saga="order", step="notify_cancellation"),
    }
    # One compensation (cancel the order); telling the customer afterwards is not one.
    assert {key: after[key] - before[key] for key in before} == {
        "compensations": 1,
        "compensated": 1,
        "refused": 1,
        "durations": 1,
        "lock_waits": 1,
        "notices": 0,
    }


def test_a_duplicate_delivery_is_counted_as_one(runtime: Runtime, conn) -> None:
    spec = STEPS["pingpong.pong"]
    message = message_for(spec.actor_name, Pong(uuid.uuid4()))
    before = _sample("estafeta_step_deliveries_total", actor=spec.actor_name, outcome="duplicate")
    assert deliver(spec, runtime, message) is Outcome.OK
    assert deliver(spec, runtime, message) is Outcome.DUPLICATE
    assert _sample("estafeta_step_deliveries_total", actor=spec.actor_name, outcome="duplicate") - before == 1
