"""The order's history: events recorded by the order saga's transitions, the OrderSummary projection, as-of views."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest

from estafeta import Clock, Projector, Runtime, SagaTransition, Watchdog, from_json
from estafeta.events.projection_ops import rebuild
from estafeta.testing import VirtualClock
from estafeta_actors import order_history
from estafeta_actors.order_events import STORE, PaymentCharged, stream_id
from estafeta_actors.order_history import OrderSummary, OrderView, record_transition
from estafeta_actors.order_saga import ORDER_SAGA, OrderData, reconcile
from estafeta_sql import event_store

from .helpers import scalar
from .shop import Courier, place, saga, seed

CHARGE = "payments.charge_payment"
RESERVE = "inventory.reserve_stock"
CONFIRM = "orders.confirm_order"
REPLY = "orders.saga_order_reply"


@pytest.fixture
def courier(runtime: Runtime, conn: psycopg.Connection[Any]) -> Courier:
    return Courier(runtime, conn)


@pytest.fixture
def projector(conn: psycopg.Connection[Any]) -> Projector:
    projector = Projector(OrderSummary(), STORE)
    projector.create_tables(conn)
    return projector


def catch_up(conn: psycopg.Connection[Any], projector: Projector, timeout: float = 90.0) -> None:
    """Run batches until nothing is left to read (other runs' open transactions on the server may hold events back)."""
    deadline, checkpoint = time.monotonic() + timeout, (0, 0)
    while time.monotonic() < deadline:
        # Held back now, or not: asked BEFORE the batch, so a batch that then finds nothing more
        # has read everything committed before this check (asked after, a transaction ending in
        # between would make events held back from the batch look read).
        held = event_store.held_back(conn, "orders", after=checkpoint)
        result = projector.run_batch(conn)
        assert result.failed is None, result.failed
        checkpoint = result.checkpoint
        if not result.more and not held:
            return
        if not result.more:
            time.sleep(0.01)
    raise AssertionError(f"order history events still held back after {timeout} s")


def timeline(view: OrderView | None) -> list[str]:
    assert view is not None
    return [entry.what for entry in view.timeline]


def summary(conn: psycopg.Connection[Any], projector: Projector, order_id: uuid.UUID) -> OrderView:
    catch_up(conn, projector)
    found = order_history.projected(conn, order_id)
    assert found.lag_events == 0 and found.view is not None
    return found.view


def saga_data(conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> OrderData:
    """The saga's data as its row stores it."""
    return from_json(OrderData, saga(conn, saga_id).payload)


def now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock (the one that stamps events)."""
    moment = scalar(conn, "SELECT clock_timestamp()")
    assert isinstance(moment, datetime)
    return moment


def test_a_confirmed_order_has_its_whole_timeline(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    view = summary(conn, projector, placed.order_id)
    assert timeline(view) == ["placed", "paid", "reserved", "confirmed", "notified"]
    assert (view.status, view.customer_id, view.sku, view.quantity) == ("confirmed", "c1", "s1", 2)
    assert (view.amount_cents, view.charged_cents, view.refunded_cents, view.cancel_reason) == (3_000, 3_000, 0, None)
    milestones = [view.placed_at, view.paid_at, view.reserved_at, view.confirmed_at, view.notified_at]
    assert all(milestones) and milestones == sorted(milestones)  # type: ignore[type-var]
    assert [entry.at for entry in view.timeline] == milestones
    assert (view.cancelled_at, view.refunded_at, view.released_at, view.failed_at) == (None, None, None, None)
    # The projection and a fold of the events themselves agree, and every event names its saga.
    assert order_history.as_of(conn, placed.order_id) == view
    recorded = STORE.read(conn, stream_id(placed.order_id))
    assert {r.metadata.correlation_id for r in recorded} == {str(placed.saga_id)}
    projected_at = scalar(conn, "SELECT projected_at FROM orders.order_summary WHERE order_id = %s", placed.order_id)
    assert projected_at >= view.notified_at


def test_a_cancelled_order_says_why(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    view = summary(conn, projector, placed.order_id)
    assert timeline(view) == ["placed", "payment refused", "cancelled", "notified"]
    assert view.status == "cancelled" and view.paid_at is None and view.charged_cents == 0
    assert view.cancel_reason is not None
    assert view.cancel_reason.startswith("charge_payment: insufficient funds: customer c1 has 1000 cents")
    assert view.timeline[1].detail is not None and view.timeline[1].detail.startswith("insufficient funds")
    assert view.timeline[3].detail == "order cancelled"
    assert view.cancel_reason == saga(conn, placed.saga_id).last_error


def test_missing_stock_is_refunded_then_cancelled(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    view = summary(conn, projector, placed.order_id)
    assert timeline(view) == ["placed", "paid", "stock refused", "refunded", "cancelled", "notified"]
    assert (view.charged_cents, view.refunded_cents, view.status) == (3_000, 3_000, "cancelled")
    assert view.cancel_reason is not None and view.cancel_reason.startswith("reserve_inventory: out of stock")


def test_an_aborted_order_says_the_operator_gave_up(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.abort(tx, placed.saga_id, "customer called")
    courier.run()
    view = summary(conn, projector, placed.order_id)
    # The charge sent before the abort still reaches payments (its answer is stale): the refund undoes it.
    assert timeline(view) == ["placed", "gave up", "refunded", "cancelled", "notified"]
    assert view.timeline[1].detail == "charge_payment: aborted: customer called"
    assert (view.paid_at, view.refunded_cents) == (None, 3_000)
    assert (view.status, view.cancel_reason) == ("cancelled", "aborted: customer called")


def test_as_of_shows_the_order_as_it_was(runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    before = now(conn)
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    assert courier.deliver(courier.take(REPLY)) == "ok"
    paid = now(conn)
    courier.run()
    assert order_history.as_of(conn, placed.order_id, before) is None
    then = order_history.as_of(conn, placed.order_id, paid)
    assert timeline(then) == ["placed", "paid"]
    assert then is not None and (then.status, then.confirmed_at, then.version) == ("pending", None, 2)
    assert timeline(order_history.as_of(conn, placed.order_id)) == [
        "placed",
        "paid",
        "reserved",
        "confirmed",
        "notified",
    ]


def test_a_duplicate_or_second_reply_records_nothing_twice(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    reply = courier.take(REPLY)
    assert courier.deliver(reply) == "ok"
    assert STORE.version(conn, stream_id(placed.order_id)) == 2
    assert courier.deliver(reply) == "duplicate"  # a relay re-publish or a broker redelivery
    assert courier.deliver(attrs.evolve(reply, message_id=uuid.uuid4())) == "ok"  # an answer to a copy: stale
    assert STORE.version(conn, stream_id(placed.order_id)) == 2
    courier.run()
    view = summary(conn, projector, placed.order_id)
    assert timeline(view) == ["placed", "paid", "reserved", "confirmed", "notified"]


def test_an_event_applied_again_changes_nothing(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    view = summary(conn, projector, placed.order_id)
    recorded = STORE.read(conn, stream_id(placed.order_id))
    assert order_history.apply(view, recorded[2]) == view
    assert order_history.fold([*recorded, *recorded]) == view


def test_a_hook_that_raises_rolls_the_transition_back(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    reply = courier.take(REPLY)
    seen: list[SagaTransition] = []

    def broken(tx: psycopg.Connection[Any], transition: SagaTransition) -> None:
        seen.append(transition)
        raise RuntimeError("the history's database is full")

    monkeypatch.setattr(ORDER_SAGA, "on_transition", broken)
    with pytest.raises(RuntimeError, match="database is full"):
        courier.deliver(reply)  # a worker would retry it
    assert [(t.event, t.previous_step, t.step) for t in seen] == [("advanced", "charge_payment", "reserve_inventory")]
    assert seen[0].reply is not None and seen[0].reply.ok
    row = saga(conn, placed.saga_id)
    assert (row.status, row.current_step) == ("running", "charge_payment")
    assert courier.pending(RESERVE) == []
    monkeypatch.undo()
    assert courier.deliver(reply) == "ok"  # the redelivery moves it, once
    assert timeline(order_history.as_of(conn, placed.order_id)) == ["placed", "paid"]


def test_status_reports_the_projection_lag(
    runtime: Runtime, conn: psycopg.Connection[Any], projector: Projector
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    found = order_history.projected(conn, placed.order_id)
    assert (found.view, found.lag_events) == (None, 1)
    assert found.lag_seconds is not None and found.lag_seconds >= 0
    catch_up(conn, projector)
    assert order_history.projected(conn, placed.order_id).lag_events == 0


def test_the_reconciliation_checks_every_fact_is_recorded_once(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier
) -> None:
    seed(runtime, {"c1": 10_000, "c2": 1_000}, {"s1": 5})
    good = place(runtime, "c1", "s1", 2, 3_000)
    refused = place(runtime, "c2", "s1", 1, 3_000)
    courier.run()
    outcomes = {good.order_id: "completed", refused.order_id: "compensated"}
    assert order_history.disagreements(conn, outcomes) == []
    assert reconcile(runtime, list(outcomes), {"c1": 10_000, "c2": 1_000}, {"s1": 5}).ok
    # A fact recorded twice, or a compensated order's history claiming a payment never refunded:
    STORE.append(conn, stream_id(good.order_id), [PaymentCharged(3_000)])
    STORE.append(conn, stream_id(refused.order_id), [PaymentCharged(3_000)])
    assert order_history.disagreements(conn, outcomes) == [
        f"order {good.order_id}: saga completed, its history has PaymentCharged x2",
        f"order {refused.order_id}: saga compensated, its history has PaymentCharged without PaymentRefunded",
    ]
    assert not reconcile(runtime, list(outcomes), {"c1": 10_000, "c2": 1_000}, {"s1": 5}).ok


def _unanswered(runtime: Runtime, courier: Courier, actor: str) -> uuid.UUID:
    """An order whose ``actor`` never answers: the watchdog sends it three times, then gives up on it."""
    clock = VirtualClock(Clock(runtime, ["orders"]), watchdog=Watchdog(runtime, [ORDER_SAGA]))
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=30)
    courier.run(hold=frozenset({actor}))
    for attempt in range(1, 4):
        clock.advance(timedelta(seconds=30 * attempt + 1))  # past the deadline of this send
        while courier.pending(actor):
            courier.take(actor)
    return placed.order_id


def test_a_step_given_up_on_by_the_watchdog_says_so(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    order_id = _unanswered(runtime, courier, RESERVE)
    courier.run()
    view = summary(conn, projector, order_id)
    assert timeline(view) == ["placed", "paid", "gave up", "released", "refunded", "cancelled", "notified"]
    assert view.timeline[2].detail == "reserve_inventory: no reply after 3 attempt(s)"
    assert (view.status, view.cancel_reason) == ("cancelled", "reserve_inventory: no reply after 3 attempt(s)")
    assert view.reserved_at is None and view.released_at is not None  # the release found nothing to undo


def test_a_saga_failed_for_an_operator_then_resumed(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector
) -> None:
    order_id = _unanswered(runtime, courier, CONFIRM)
    stopped = summary(conn, projector, order_id)
    assert timeline(stopped) == ["placed", "paid", "reserved", "saga failed"]
    assert (stopped.status, stopped.failure) == ("pending", "confirm_order: no reply after 3 attempt(s)")
    (saga_id,) = ORDER_SAGA.of_key(conn, order_id)
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.resume(tx, saga_id)
    courier.run()
    view = summary(conn, projector, order_id)
    assert timeline(view) == ["placed", "paid", "reserved", "saga failed", "resumed", "confirmed", "notified"]
    assert (view.status, view.failure, view.failed_at) == ("confirmed", None, stopped.failed_at)


def test_the_hook_sees_every_transition_with_its_cause(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[SagaTransition] = []

    def spy(tx: psycopg.Connection[Any], transition: SagaTransition) -> None:
        seen.append(transition)
        record_transition(tx, transition)

    monkeypatch.setattr(ORDER_SAGA, "on_transition", spy)
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    assert [(t.event, t.previous_step, t.step, t.reply.ok if t.reply else None) for t in seen] == [
        ("started", None, "charge_payment", None),
        ("advanced", "charge_payment", "reserve_inventory", True),
        ("compensating", "reserve_inventory", "charge_payment", False),
        ("undone", "charge_payment", "place_order", True),
        ("undone", "place_order", "notify_cancellation", True),
        ("compensated", "notify_cancellation", "notify_cancellation", True),
    ]
    assert {(t.saga_id, t.key) for t in seen} == {(placed.saga_id, placed.order_id)}
    assert seen[0].data == saga_data(conn, placed.saga_id)
    assert seen[2].error is not None and seen[2].error.startswith("reserve_inventory: out of stock")
    assert [t.previous_status for t in seen] == [
        None,
        "running",
        "running",
        "compensating",
        "compensating",
        "compensating",
    ]


def test_a_rebuild_builds_the_same_summaries(
    runtime: Runtime, conn: psycopg.Connection[Any], courier: Courier, projector: Projector, database_url: str
) -> None:
    seed(runtime, {"c1": 10_000, "c2": 1_000}, {"s1": 5})
    ids = [place(runtime, "c1", "s1", 2, 3_000).order_id, place(runtime, "c2", "s1", 1, 3_000).order_id]
    courier.run()
    catch_up(conn, projector)
    before = [order_history.projected(conn, order_id).view for order_id in ids]
    rebuild(database_url, OrderSummary(), STORE)
    after = [order_history.projected(conn, order_id).view for order_id in ids]
    assert after == before and None not in after
    assert [o.status for o in after if o] == ["confirmed", "cancelled"]
