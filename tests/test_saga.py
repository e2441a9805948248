"""The saga engine, driven message by message: happy path, failures, replies, deadlines, operators."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import attrs
import pytest

from estafeta import Clock, Reply, Runtime, Saga, SagaError, SagaStep, Service, Watchdog
from estafeta.sagas.saga_metrics import REPLIES
from estafeta.testing import VirtualClock
from estafeta_actors import order_events, order_history
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_sql import sagas

from .app import app as tests_app
from .helpers import message_for, scalar
from .shop import Courier, events, place, saga, seed

CHARGE = "payments.charge_payment"
REFUND = "payments.refund_payment"
RESERVE = "inventory.reserve_stock"
RELEASE = "inventory.release_stock"
CONFIRM = "orders.confirm_order"
CANCEL = "orders.cancel_order"
NOTIFY = "notifications.notify_customer"
REPLY = "orders.saga_order_reply"


def balance(conn, customer: str = "c1") -> int:
    return int(scalar(conn, "SELECT balance_cents FROM payments.accounts WHERE customer_id = %s", customer))


def available(conn, sku: str = "s1") -> int:
    return int(scalar(conn, "SELECT available FROM inventory.stock WHERE sku = %s", sku))


def notified(conn, order_id: uuid.UUID) -> list[str]:
    rows = conn.execute("SELECT kind FROM notifications.sent WHERE order_id = %s ORDER BY kind", (order_id,))
    return [r[0] for r in rows.fetchall()]


def order_status(conn, order_id: uuid.UUID) -> str:
    return str(scalar(conn, "SELECT status FROM orders.orders WHERE order_id = %s", order_id))


def snapshot(conn, saga_id: uuid.UUID) -> tuple[object, ...]:
    """Everything a reply could change: the saga row, its log, and what waits in the outboxes."""
    row = saga(conn, saga_id)
    outboxes = sum(
        scalar(conn, f"SELECT count(*) FROM {s}.outbox") for s in ("orders", "payments", "inventory", "notifications")
    )
    return row, len(events(conn, saga_id)), outboxes


#: The order saga's step timeout in these tests: the default, passed on the virtual clock.
TIMEOUT = 30


def overdue(clock: VirtualClock, attempt: int = 1) -> Counter[str]:
    """Let the saga's deadline for its ``attempt``-th send pass; return what the watchdog did."""
    # The wait grows with each send (timeout x attempt); a second more is past it.
    return clock.advance(timedelta(seconds=TIMEOUT * attempt + 1)).watchdog


@pytest.fixture
def courier(runtime: Runtime, conn) -> Courier:
    return Courier(runtime, conn)


@pytest.fixture
def watchdog(runtime: Runtime) -> Watchdog:
    return Watchdog(runtime, [ORDER_SAGA])


@pytest.fixture
def clock(runtime: Runtime, watchdog: Watchdog) -> VirtualClock:
    """The plugin's virtual clock with the watchdog; the Courier delivers by hand, so no relay pass."""
    return VirtualClock(Clock(runtime, tests_app.service_names), watchdog=watchdog)


# -- the happy path and the failure branches ---------------------------------------------


def test_an_order_completes_with_every_step_once(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    assert delivered == [
        (CHARGE, "ok"), (REPLY, "ok"), (RESERVE, "ok"), (REPLY, "ok"),
        (CONFIRM, "ok"), (REPLY, "ok"), (NOTIFY, "ok"), (REPLY, "ok"),
    ]  # fmt: skip
    row = saga(conn, placed.saga_id)
    assert (row.status, row.last_error, row.deadline_at) == ("completed", None, None)
    assert row.completed_at is not None
    assert set(row.results) == {"charge_payment", "reserve_inventory", "confirm_order", "notify_customer"}
    assert (balance(conn), available(conn)) == (7_000, 3)
    assert order_status(conn, placed.order_id) == "confirmed"
    assert notified(conn, placed.order_id) == ["confirmed"]
    assert [e[0] for e in events(conn, placed.saga_id)] == ["started", "advanced", "advanced", "advanced", "completed"]


def test_placing_an_order_is_one_transaction(runtime: Runtime, conn) -> None:
    from estafeta_actors.order_saga import place_order

    with pytest.raises(RuntimeError), runtime.database("orders").transaction() as tx:
        place_order(tx, customer_id="c1", sku="s1", quantity=1, amount_cents=100)
        raise RuntimeError("the caller fails after placing")
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == 0
    assert scalar(conn, "SELECT count(*) FROM orders.saga_order") == 0
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 0


@pytest.mark.parametrize(
    ("accounts", "reason"),
    [({"c1": 1_000}, "insufficient funds: customer c1 has 1000 cents"), ({}, "customer c1 has no account")],
)
def test_a_refused_charge_cancels_the_order_and_tells_the_customer(
    runtime: Runtime, conn, courier: Courier, accounts: dict[str, int], reason: str
) -> None:
    seed(runtime, accounts, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    assert [actor for actor, _ in delivered] == [CHARGE, REPLY, CANCEL, REPLY, NOTIFY, REPLY]
    assert delivered[0] == (CHARGE, "failed")
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert row.last_error is not None and row.last_error.startswith(f"charge_payment: {reason}")
    assert row.compensations == ["place_order", "notify_cancellation"]
    assert order_status(conn, placed.order_id) == "cancelled"
    assert notified(conn, placed.order_id) == ["cancelled"]
    assert scalar(conn, "SELECT count(*) FROM payments.payments WHERE status <> 'refused'") == 0
    assert available(conn) == 5


def test_missing_stock_compensates_the_completed_steps_in_reverse_order(
    runtime: Runtime, conn, courier: Courier
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    assert [actor for actor, _ in delivered] == [
        CHARGE, REPLY, RESERVE, REPLY, REFUND, REPLY, CANCEL, REPLY, NOTIFY, REPLY,
    ]  # fmt: skip
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert row.last_error == f"reserve_inventory: out of stock: 1 of s1 left, order {placed.order_id} needs 2"
    assert [(e[0], e[2]) for e in events(conn, placed.saga_id)] == [
        ("started", "charge_payment"),
        ("advanced", "reserve_inventory"),
        ("compensating", "charge_payment"),
        ("undone", "place_order"),
        ("undone", "notify_cancellation"),
        ("compensated", "notify_cancellation"),
    ]
    # Each entry says what was done: the undos undid, the notice after them was sent, not undone.
    details = [e.detail for e in sagas.timeline(conn, ORDER_SAGA.table, placed.saga_id)][-3:]
    assert details == ["charge_payment undone", "place_order undone", "notify_cancellation done after compensating"]
    assert (balance(conn), available(conn)) == (10_000, 1)
    assert scalar(conn, "SELECT status FROM payments.payments WHERE order_id = %s", placed.order_id) == "refunded"
    assert order_status(conn, placed.order_id) == "cancelled"
    assert notified(conn, placed.order_id) == ["cancelled"]


# -- replies: duplicate, stale, late -------------------------------------------------------


def _advance_past_charge(runtime: Runtime, courier: Courier) -> tuple[uuid.UUID, object]:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    reply = courier.take(REPLY)
    assert courier.deliver(reply) == "ok"
    return placed.saga_id, reply


def test_a_duplicate_reply_is_absorbed_by_the_inbox(runtime: Runtime, conn, courier: Courier) -> None:
    saga_id, reply = _advance_past_charge(runtime, courier)
    before = snapshot(conn, saga_id)
    assert courier.deliver(reply) == "duplicate"  # type: ignore[arg-type]
    assert snapshot(conn, saga_id) == before


def test_a_second_answer_to_the_same_command_changes_nothing(runtime: Runtime, conn, courier: Courier) -> None:
    # The same reply under another message id: the participant answered a copy of the command.
    saga_id, reply = _advance_past_charge(runtime, courier)
    before = snapshot(conn, saga_id)
    stale = REPLIES.labels("order", "stale")._value.get()
    assert courier.deliver(attrs.evolve(reply, message_id=uuid.uuid4())) == "ok"  # type: ignore[misc]
    assert snapshot(conn, saga_id) == before
    assert REPLIES.labels("order", "stale")._value.get() == stale + 1


@pytest.mark.parametrize(
    "context",
    [
        {"step": "reserve_inventory", "version": 1, "direction": "action"},  # an older version
        {"step": "reserve_inventory", "version": 3, "direction": "action"},  # a version not reached
        {"step": "charge_payment", "version": 2, "direction": "action"},  # another step
        {"step": "reserve_inventory", "version": 2, "direction": "compensation"},  # the other direction
    ],
)
def test_a_stale_reply_changes_nothing(runtime: Runtime, conn, courier: Courier, context: dict[str, object]) -> None:
    saga_id, _ = _advance_past_charge(runtime, courier)
    assert saga(conn, saga_id).version == 2
    before = snapshot(conn, saga_id)
    for ok in (True, False):
        body = Reply(str(uuid.uuid4()), ok, {"saga": "order", "saga_id": str(saga_id), **context}, error="no")
        message = message_for(REPLY, body)
        assert courier.deliver(courier_row(message)) == "ok"
    assert snapshot(conn, saga_id) == before


def courier_row(message):  # type: ignore[no-untyped-def]
    """An outbox row carrying ``message`` (as if a participant had written it)."""
    from datetime import UTC, datetime

    from estafeta_sql.outbox import OutboxRow

    return OutboxRow(
        id=0,
        message_id=uuid.UUID(message.message_id),
        queue_name=message.queue_name,
        actor_name=message.actor_name,
        message={"args": list(message.args), "kwargs": {}, "options": message.options},
        ordering_key=None,
        saga_id=None,
        created_at=datetime.now(UTC),
        attempts=0,
    )


def test_a_reply_for_no_saga_is_dead_lettered(runtime: Runtime, conn, courier: Courier) -> None:
    body = Reply(str(uuid.uuid4()), True, {"saga": "order", "saga_id": str(uuid.uuid4()), "step": "x", "version": 1})
    assert courier.deliver(courier_row(message_for(REPLY, body))) == "failed"
    assert "no order saga" in scalar(conn, "SELECT reason FROM orders.dead_letters")


def _spend_attempts(courier: Courier, clock: VirtualClock, actor: str) -> None:
    """Let every send of ``actor``'s command go unanswered until its attempts are spent (the watchdog's three)."""
    for attempt in range(1, 4):
        overdue(clock, attempt)
        while courier.pending(actor):
            courier.take(actor)  # lost: the participant never sees it


def _give_up_on_charge(conn, courier: Courier, clock: VirtualClock, saga_id: uuid.UUID) -> None:
    """Let every send of the charge go unanswered until the saga compensates it."""
    for attempt in range(1, 4):
        assert overdue(clock, attempt) == ({"resent": 1} if attempt < 3 else {"compensating": 1})
        while courier.pending(CHARGE):
            courier.take(CHARGE)  # lost: the participant never sees it
    assert saga(conn, saga_id).status == "compensating"


@pytest.mark.parametrize("late_charge_arrives", ["before the refund", "after the refund"])
def test_a_late_charge_after_the_saga_gave_up_is_undone_or_refused(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock, late_charge_arrives: str
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    late = courier.take(CHARGE)  # in flight somewhere, for longer than the saga waits
    _give_up_on_charge(conn, courier, clock, placed.saga_id)
    assert saga(conn, placed.saga_id).compensations == ["charge_payment", "place_order", "notify_cancellation"]
    if late_charge_arrives == "after the refund":
        assert courier.deliver(courier.take(REFUND)) == "ok"
        assert courier.deliver(courier.take(REPLY)) == "ok"
        assert courier.deliver(late) == "failed"  # refused: the order was cancelled before it was charged
    else:
        assert courier.deliver(late) == "ok"
    before = snapshot(conn, placed.saga_id)
    assert courier.deliver(courier.take(REPLY)) == "ok"  # the late answer to the charge
    assert snapshot(conn, placed.saga_id)[0] == before[0]
    courier.run()
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert row.last_error == "charge_payment: no reply after 3 attempt(s)"
    assert balance(conn) == 10_000
    assert scalar(conn, "SELECT status FROM payments.payments") == "refunded"


# -- deadlines --------------------------------------------------------------------------


def test_the_watchdog_sends_a_lost_command_again(runtime: Runtime, conn, courier: Courier, clock: VirtualClock) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=60)
    lost = courier.take(CHARGE)
    assert clock.advance(timedelta(seconds=59)).watchdog == {}  # not yet past the deadline
    assert clock.advance(timedelta(seconds=2)).watchdog == {"resent": 1}
    (again,) = courier.pending(CHARGE)
    # The same command and the same question (step, version), as a new message: a new attempt.
    assert again.message_id != lost.message_id
    assert again.message["args"] == lost.message["args"]
    assert again.message["options"]["reply_to"] == lost.message["options"]["reply_to"]
    courier.run()
    row = saga(conn, placed.saga_id)
    assert row.status == "completed"
    assert ("resent", "running", "charge_payment") in events(conn, placed.saga_id)


def test_each_send_keeps_its_message_id_so_copies_of_it_are_absorbed(
    runtime: Runtime, conn, courier: Courier, watchdog: Watchdog
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    (first,) = courier.pending(CHARGE)
    with runtime.database("orders").transaction() as tx:
        row = saga(tx, placed.saga_id)
        assert ORDER_SAGA.target(row)[1] == first.message_id  # derived, not random: a retried write repeats it
    assert courier.deliver(first) == "ok"
    assert courier.deliver(first) == "duplicate"  # a relay re-publish or a broker redelivery
    assert balance(conn) == 7_000


def test_a_command_sent_again_after_it_took_effect_is_answered_again_without_taking_effect_twice(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    assert courier.deliver(courier.take(CHARGE)) == "ok"
    stuck = courier.take(REPLY)  # the answer is stuck (a killed Redis worker had it prefetched)
    assert overdue(clock) == {"resent": 1}
    assert courier.deliver(courier.take(CHARGE)) == "ok"  # found the payment: charged nothing more
    assert courier.deliver(courier.take(REPLY)) == "ok"  # the second answer moves the saga on
    assert saga(conn, placed.saga_id).current_step == "reserve_inventory"
    before = snapshot(conn, placed.saga_id)
    assert courier.deliver(stuck) == "ok"  # the first answer, late: stale now
    assert snapshot(conn, placed.saga_id) == before
    courier.run()
    assert saga(conn, placed.saga_id).status == "completed"
    assert balance(conn) == 7_000
    assert scalar(conn, "SELECT count(*) FROM payments.payments") == 1


def test_a_late_answer_to_a_compensation_given_up_for_want_of_replies_finishes_the_compensation(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    # Found by the network fault suite: a 60 s cut between the workers and the broker outlasted
    # the refund's attempts; the refunds' answers came seconds after the saga had failed, and
    # were ignored as stale: the order stayed pending, its saga failed, for an operator.
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    _give_up_on_charge(conn, courier, clock, placed.saga_id)
    late = courier.take(REFUND)  # held up by the partition
    for attempt in range(1, 4):
        assert overdue(clock, attempt) == ({"resent": 1} if attempt < 3 else {"gave_up": 1})
        while courier.pending(REFUND):
            courier.take(REFUND)  # lost
    failed = saga(conn, placed.saga_id)
    assert (failed.status, failed.last_error) == ("gave_up", "compensation charge_payment: no reply after 3 attempt(s)")
    assert courier.deliver(late) == "ok"  # the partition heals: the refund is done after all
    assert courier.deliver(courier.take(REPLY)) == "ok"
    courier.run()
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert order_status(conn, placed.order_id) == "cancelled"
    assert (balance(conn), available(conn)) == (10_000, 5)
    # The order's history records the refund the late answer reported, once.
    assert order_history.disagreements(conn, {placed.order_id: "compensated"}) == []
    history = [type(r.event).__name__ for r in order_events.STORE.read(conn, order_events.stream_id(placed.order_id))]
    assert history.count("PaymentRefunded") == 1, history


def test_a_late_answer_to_a_step_past_the_point_of_no_return_given_up_completes_the_saga(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier.run(hold=frozenset({CONFIRM}))
    late = courier.take(CONFIRM)
    _spend_attempts(courier, clock, CONFIRM)
    assert saga(conn, placed.saga_id).status == "gave_up"
    assert courier.deliver(late) == "ok"
    assert courier.deliver(courier.take(REPLY)) == "ok"
    courier.run()
    done = saga(conn, placed.saga_id)
    # A completed saga does not read "no reply after 3 attempt(s)": the timeline keeps it.
    assert (done.status, done.last_error) == ("completed", None)
    assert ("gave_up", "gave_up", "confirm_order") in events(conn, placed.saga_id)
    assert order_status(conn, placed.order_id) == "confirmed"


def test_a_late_answer_is_stale_once_an_operator_resumed_the_failed_saga(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier.run(hold=frozenset({CONFIRM}))
    late = courier.take(CONFIRM)
    _spend_attempts(courier, clock, CONFIRM)
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, placed.saga_id) == "retrying"
    assert courier.deliver(late) == "ok"
    answer = courier.take(REPLY)
    before = snapshot(conn, placed.saga_id)
    assert courier.deliver(answer) == "ok"  # answers the send before the resume: stale
    assert snapshot(conn, placed.saga_id) == before
    courier.run()
    assert saga(conn, placed.saga_id).status == "completed"


def test_a_resent_command_still_in_the_outbox_is_put_back_in_line(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    conn.execute("UPDATE orders.outbox SET status = 'failed', attempts = 5, last_error = 'broker refused'")
    assert overdue(clock) == {"resent": 1}
    rows = conn.execute("SELECT status, attempts FROM orders.outbox").fetchall()
    assert rows == [("pending", 0)]


def test_an_unanswered_step_is_compensated_itself_once_its_attempts_are_spent(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier.run(hold=frozenset({RESERVE}))
    _spend_attempts(courier, clock, RESERVE)
    row = saga(conn, placed.saga_id)
    assert row.status == "compensating"
    assert row.compensations == ["reserve_inventory", "charge_payment", "place_order", "notify_cancellation"]
    courier.run()
    row = saga(conn, placed.saga_id)
    assert (row.status, row.last_error) == ("compensated", "reserve_inventory: no reply after 3 attempt(s)")
    assert (balance(conn), available(conn)) == (10_000, 5)
    # The release found nothing reserved and left a marker that refuses a late reservation.
    assert conn.execute("SELECT status, quantity FROM inventory.reservations").fetchall() == [("released", 0)]


def test_an_unanswered_step_past_the_point_of_no_return_fails_the_saga_until_resumed(
    runtime: Runtime, conn, courier: Courier, clock: VirtualClock
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier.run(hold=frozenset({CONFIRM}))
    _spend_attempts(courier, clock, CONFIRM)
    row = saga(conn, placed.saga_id)
    assert (row.status, row.last_error) == ("gave_up", "confirm_order: no reply after 3 attempt(s)")
    assert (balance(conn), available(conn)) == (7_000, 3)  # nothing compensated
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, placed.saga_id) == "retrying"
    courier.run()
    assert saga(conn, placed.saga_id).status == "completed"
    assert order_status(conn, placed.order_id) == "confirmed"


# -- operators --------------------------------------------------------------------------


def test_abort_compensates_a_running_saga_including_its_current_step(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run(hold=frozenset({RESERVE}))
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.abort(tx, placed.saga_id, "customer called")
    courier.run()
    row = saga(conn, placed.saga_id)
    assert (row.status, row.last_error) == ("compensated", "aborted: customer called")
    assert (balance(conn), available(conn)) == (10_000, 5)
    with (
        pytest.raises(SagaError, match="is compensated: nothing to abort"),
        runtime.database("orders").transaction() as tx,
    ):
        ORDER_SAGA.abort(tx, placed.saga_id, "again")


def test_abort_refuses_a_saga_past_its_point_of_no_return(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run(hold=frozenset({CONFIRM}))
    with pytest.raises(SagaError, match="past its point of no return"), runtime.database("orders").transaction() as tx:
        ORDER_SAGA.abort(tx, placed.saga_id, "too late")


def test_resume_sends_a_live_sagas_command_again_now_under_a_new_version(
    runtime: Runtime, conn, courier: Courier
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    slow = courier.take(CHARGE)
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, placed.saga_id) == "resent"
    row = saga(conn, placed.saga_id)
    assert (row.version, row.attempts, row.current_step) == (2, 1, "charge_payment")
    (again,) = courier.pending(CHARGE)
    assert again.message_id != slow.message_id
    courier.run()
    assert saga(conn, placed.saga_id).status == "completed"
    assert courier.deliver(slow) == "ok"  # the slow first send: charged nothing more, its answer stale
    courier.run()
    assert saga(conn, placed.saga_id).version == 6
    assert balance(conn) == 7_000


def test_resume_refuses_an_ended_saga(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    courier.run()
    with (
        pytest.raises(SagaError, match="is completed: nothing to resume"),
        runtime.database("orders").transaction() as tx,
    ):
        ORDER_SAGA.resume(tx, placed.saga_id)


# -- definitions ------------------------------------------------------------------------


def _command(_state: object) -> object:
    return object()


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([SagaStep("a", _command), SagaStep("a", _command)], "step names must be unique"),
        ([SagaStep("a", _command), SagaStep("b")], "only leading steps may lack an action"),
        ([SagaStep("a")], "only leading steps may lack an action"),
        ([SagaStep("a", _command, _command, retriable=True)], "a retriable step is past the point of no return"),
    ],
)
def test_a_malformed_saga_is_refused_when_declared(steps: list[SagaStep], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Saga("malformed", service=Service("scratch"), data=dict, key="order_id", steps=steps)


def test_a_reply_locks_its_saga_in_its_first_round_trip(database_url: str) -> None:
    """The reply step's opening statement (``Saga._opening``): the saga's row comes locked with the inbox record.

    Counted from the libpq trace of each delivery (``bench.step_cost``, on a database of its
    own): the count and the transaction's opening with the saga's row, the transition, the
    ``on_transition`` hook's event, the commit. Without the opening statement: 5.
    """
    from bench import step_cost

    from .services import admin_dsn

    reply = step_cost.run(orders=2, pings=0, admin=admin_dsn())["orders.saga_order_reply"]
    assert reply.deliveries == 8
    assert reply.round_trips == 4 * reply.deliveries
