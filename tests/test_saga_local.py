"""A saga's local steps (``Saga(local_steps=True)``): the orchestrator's own service's steps run in its transaction.

The demo's order saga, driven message by message, with ``local_steps`` on: ``ConfirmOrder``
and ``CancelOrder`` (steps of the orders service, which orchestrates the saga) are never
sent; they run in the transaction of the reply that moved the saga to them, and the saga
moves on in that same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from estafeta import Clock, Runtime, StepContext, Watchdog
from estafeta.messaging import outbox as outbox
from estafeta.sagas.local_steps import LocalOutcome, run_local, runs_local
from estafeta.steps.outcome import Outcome
from estafeta.testing import VirtualClock
from estafeta_actors import orders, pingpong
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_actors.pingpong import Pong

from . import steps
from .app import app as tests_app
from .helpers import scalar
from .shop import Courier, events, place, saga, seed
from .test_saga import (
    CHARGE,
    CONFIRM,
    NOTIFY,
    REFUND,
    RELEASE,
    REPLY,
    RESERVE,
    TIMEOUT,
    available,
    balance,
    notified,
    order_status,
    overdue,
)

pytestmark = pytest.mark.usefixtures("local_steps")


@pytest.fixture
def local_steps() -> Iterator[None]:
    ORDER_SAGA.local_steps = True
    try:
        yield
    finally:
        ORDER_SAGA.local_steps = False


@pytest.fixture
def courier(runtime: Runtime, conn) -> Courier:
    return Courier(runtime, conn)


@pytest.fixture
def clock(runtime: Runtime) -> VirtualClock:
    """The virtual clock with the order saga's watchdog; the Courier delivers by hand, so no relay pass."""
    return VirtualClock(Clock(runtime, tests_app.service_names), watchdog=Watchdog(runtime, [ORDER_SAGA]))


def _inbox(conn, consumer: str) -> int:
    return int(scalar(conn, "SELECT count(*) FROM orders.inbox WHERE consumer = %s", consumer))


def test_the_confirmation_runs_in_the_reply_that_reached_it(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    # Two messages fewer: no ConfirmOrder, and no reply to it.
    assert delivered == [
        (CHARGE, "ok"), (REPLY, "ok"), (RESERVE, "ok"), (REPLY, "ok"), (NOTIFY, "ok"), (REPLY, "ok"),
    ]  # fmt: skip
    row = saga(conn, placed.saga_id)
    assert (row.status, row.last_error) == ("completed", None)
    assert set(row.results) == {"charge_payment", "reserve_inventory", "confirm_order", "notify_customer"}
    assert (balance(conn), available(conn)) == (7_000, 3)
    assert order_status(conn, placed.order_id) == "confirmed"
    assert notified(conn, placed.order_id) == ["confirmed"]
    # The saga's log and the order's history are those of the messages' path.
    assert [e[0] for e in events(conn, placed.saga_id)] == ["started", "advanced", "advanced", "advanced", "completed"]
    assert _inbox(conn, "orders.confirm_order") == 0


def test_a_refused_charge_cancels_the_order_in_the_reply_of_the_refusal(
    runtime: Runtime, conn, courier: Courier
) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    assert delivered == [(CHARGE, "failed"), (REPLY, "ok"), (NOTIFY, "ok"), (REPLY, "ok")]
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert row.compensations == ["place_order", "notify_cancellation"]
    assert order_status(conn, placed.order_id) == "cancelled"
    assert notified(conn, placed.order_id) == ["cancelled"]
    assert _inbox(conn, "orders.cancel_order") == 0


def test_missing_stock_sends_the_other_services_compensations_and_runs_its_own(
    runtime: Runtime, conn, courier: Courier
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 1})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    delivered = courier.run()
    assert [actor for actor, _ in delivered] == [CHARGE, REPLY, RESERVE, REPLY, REFUND, REPLY, NOTIFY, REPLY]
    assert RELEASE not in dict(delivered)  # the refused reservation left nothing to release
    row = saga(conn, placed.saga_id)
    assert row.status == "compensated"
    assert (balance(conn), available(conn)) == (10_000, 1)
    assert order_status(conn, placed.order_id) == "cancelled"


def test_a_local_step_that_refuses_undoes_only_its_own_work(runtime: Runtime, conn, courier: Courier) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    # Cancelled behind the saga's back: ConfirmOrder refuses (a cancelled order cannot be
    # confirmed), and the saga, past its point of no return, fails for an operator.
    conn.execute("UPDATE orders.orders SET status = 'cancelled' WHERE order_id = %s", (placed.order_id,))
    delivered = courier.run()
    assert delivered == [(CHARGE, "ok"), (REPLY, "ok"), (RESERVE, "ok"), (REPLY, "ok")]
    row = saga(conn, placed.saga_id)
    assert (row.status, row.current_step) == ("failed", "confirm_order")
    assert row.last_error is not None and row.last_error.startswith("confirm_order: ")
    # The reservation's reply that ran it committed: the reservation is recorded in the saga.
    assert set(row.results) == {"charge_payment", "reserve_inventory"}
    assert order_status(conn, placed.order_id) == "cancelled"
    assert courier.pending() == []


@pytest.fixture
def refuse_order_updates(conn) -> Iterator[Callable[[str], None]]:
    """``refuse(errcode)``: make the orders table refuse every update with a database error of that SQLSTATE
    (by name), until the test ends."""

    def refuse(errcode: str) -> None:
        conn.execute(
            f"""CREATE OR REPLACE FUNCTION orders.refuse() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN RAISE EXCEPTION 'orders are read-only' USING ERRCODE = '{errcode}'; END $$;
                CREATE TRIGGER refuse BEFORE UPDATE ON orders.orders FOR EACH ROW EXECUTE FUNCTION orders.refuse()"""
        )

    yield refuse
    conn.execute("DROP TRIGGER IF EXISTS refuse ON orders.orders")


@pytest.fixture
def break_orders(
    conn, monkeypatch: pytest.MonkeyPatch, refuse_order_updates: Callable[[str], None]
) -> Callable[[str], str]:
    """``break_orders(breakage)``: make the orders service's status steps (ConfirmOrder, CancelOrder) raise
    ``"a bug"`` (a KeyError) or ``"a database error"``; return what their error says."""

    def breaks(breakage: str) -> str:
        if breakage == "a database error":
            refuse_order_updates("raise_exception")
            return "RaiseException: orders are read-only"

        def broken(*args: object, **kwargs: object) -> None:
            raise KeyError("status")

        monkeypatch.setattr(orders, "_set_status", broken)
        return "KeyError: 'status'"

    return breaks


def _mend_orders(conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    conn.execute("DROP TRIGGER IF EXISTS refuse ON orders.orders")


@pytest.mark.parametrize("breakage", ["a bug", "a database error"])
def test_a_local_step_that_breaks_fails_the_saga_at_it_and_the_step_before_runs_once(
    runtime: Runtime,
    conn,
    courier: Courier,
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
    break_orders: Callable[[str], str],
    breakage: str,
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    error = break_orders(breakage)
    # The reservation's reply runs the confirmation, which breaks: the reply still commits.
    assert courier.run() == [(CHARGE, "ok"), (REPLY, "ok"), (RESERVE, "ok"), (REPLY, "ok")]
    row = saga(conn, placed.saga_id)
    # Past its point of no return, the saga fails for an operator, at the broken step, with its error.
    assert (row.status, row.current_step) == ("failed", "confirm_order")
    assert row.last_error == f"confirm_order: orders.confirm_order raised {error}"
    assert set(row.results) == {"charge_payment", "reserve_inventory"}
    assert order_status(conn, placed.order_id) == "pending"  # the step's work rolled back
    assert scalar(conn, "SELECT count(*) FROM orders.dead_letters") == 0  # the reply was not parked
    # Nothing waits for a reply: the watchdog sends no step again, and the reservation ran once.
    for attempt in range(1, 4):
        assert overdue(clock, attempt) == {}
        assert courier.run() == []
    assert scalar(conn, "SELECT count(*) FROM inventory.inbox WHERE consumer = %s", RESERVE) == 1
    assert available(conn) == 3
    # Once the step is mended, an operator's resume sends its command, as any other.
    _mend_orders(conn, monkeypatch)
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.resume(tx, placed.saga_id)
    assert courier.run() == [(CONFIRM, "ok"), (REPLY, "ok"), (NOTIFY, "ok"), (REPLY, "ok")]
    assert saga(conn, placed.saga_id).status == "completed"
    assert order_status(conn, placed.order_id) == "confirmed"


def test_a_local_compensation_that_breaks_fails_the_saga_at_it(
    runtime: Runtime, conn, courier: Courier, break_orders: Callable[[str], str]
) -> None:
    seed(runtime, {"c1": 1_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    error = break_orders("a bug")
    # The charge's refusal runs the order's cancellation, which breaks.
    assert courier.run() == [(CHARGE, "failed"), (REPLY, "ok")]
    row = saga(conn, placed.saga_id)
    assert (row.status, row.current_step) == ("failed", "place_order")
    assert row.last_error == f"compensation place_order failed: orders.cancel_order raised {error}"
    assert order_status(conn, placed.order_id) == "pending"
    assert scalar(conn, "SELECT count(*) FROM orders.dead_letters") == 0


def test_a_local_step_that_meets_a_transient_error_rolls_back_the_reply_that_ran_it(
    runtime: Runtime, conn, courier: Courier, refuse_order_updates: Callable[[str], None]
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    assert courier.run(hold=frozenset({REPLY})) == [(CHARGE, "ok")]
    assert courier.deliver(courier.take(REPLY)) == Outcome.OK
    assert courier.run(hold=frozenset({REPLY})) == [(RESERVE, "ok")]
    # A conflict the next try may not meet (a serialization failure, a deadlock, a lock or
    # statement timeout, a lost connection) is no fault of the step: the reply is tried again.
    refuse_order_updates("serialization_failure")
    reply = courier.take(REPLY)
    before = saga(conn, placed.saga_id)
    with pytest.raises(Exception, match="orders are read-only"):
        courier.deliver(reply)
    # Nothing of the reply's transaction stayed: the saga still waits on the reservation's
    # answer, which a redelivery brings again.
    assert saga(conn, placed.saga_id) == before
    assert _inbox(conn, REPLY) == 1  # the charge's reply; the reservation's is to come again
    assert courier.pending() == []
    conn.execute("DROP TRIGGER refuse ON orders.orders")
    assert courier.deliver(reply) == Outcome.OK
    assert courier.run() == [(NOTIFY, "ok"), (REPLY, "ok")]
    assert saga(conn, placed.saga_id).status == "completed"
    assert order_status(conn, placed.order_id) == "confirmed"


def test_a_local_step_sent_again_by_an_operator_goes_as_a_message(runtime: Runtime, conn, courier: Courier) -> None:
    # Without a reply to run in (an operator's resume, the watchdog's re-send), a local
    # step's command is sent as any other, and its step answers it as any other.
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    conn.execute("UPDATE orders.orders SET status = 'cancelled' WHERE order_id = %s", (placed.order_id,))
    courier.run()
    assert saga(conn, placed.saga_id).status == "failed"
    conn.execute("UPDATE orders.orders SET status = 'pending' WHERE order_id = %s", (placed.order_id,))
    with runtime.database("orders").transaction() as tx:
        ORDER_SAGA.resume(tx, placed.saga_id)
    assert courier.run() == [(CONFIRM, "ok"), (REPLY, "ok"), (NOTIFY, "ok"), (REPLY, "ok")]
    assert saga(conn, placed.saga_id).status == "completed"
    assert order_status(conn, placed.order_id) == "confirmed"
    assert _inbox(conn, CONFIRM) == 1


# -- the local step's run, on the tests' probe service ----------------------------------


def _parent(runtime: Runtime, tx) -> StepContext:
    """The orchestrator step's context a local step runs in (the probe service's, here)."""
    return StepContext(
        conn=tx,
        service="probe",
        message_id=uuid.uuid4(),
        saga_id=None,
        options={},
        payload={},
        router=steps.refuse.router,
        runtime=runtime,
    )


def test_a_refusing_local_step_takes_back_its_work_and_sends_not_the_callers(runtime: Runtime, conn) -> None:
    ours, theirs = uuid.uuid4(), uuid.uuid4()
    with runtime.database("probe").transaction() as tx, outbox.held_until_commit(tx):
        parent = _parent(runtime, tx)
        tx.execute("INSERT INTO probe.pings (ping_id, sent_at) VALUES (%s, now())", (ours,))
        parent.send(Pong(ours))
        done = run_local(
            parent, steps.refuse, steps.Refuse(theirs), message_id=uuid.uuid4(), saga_id=uuid.uuid4(), options={}
        )
        outbox.write_held(tx)
    assert done == LocalOutcome(ok=False, error="not enough money in account 42")
    # The step recorded its ping and sent its pong before refusing: both undone. The
    # caller's ping and pong, written before the step ran, committed.
    assert [r[0] for r in conn.execute("SELECT ping_id FROM probe.pings").fetchall()] == [ours]
    sent = [r[0] for r in conn.execute("SELECT message->'args'->0->>'ping_id' FROM probe.outbox").fetchall()]
    assert sent == [str(ours)]


def test_a_local_step_takes_its_lock_and_runs_its_opening_in_the_callers_transaction(runtime: Runtime, conn) -> None:
    ping_id = uuid.uuid4()
    with runtime.database("probe").transaction() as tx, outbox.held_until_commit(tx):
        done = run_local(
            _parent(runtime, tx),
            steps.peek,
            steps.Peek(ping_id),
            message_id=uuid.uuid4(),
            saga_id=uuid.uuid4(),
            options={},
        )
        backend = tx.info.backend_pid
        locks = scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", backend)
    assert done == LocalOutcome(ok=True)
    assert locks == 1  # held to the end of the caller's transaction
    opening = steps.PEEKED[ping_id]["opening"]
    assert isinstance(opening, list) and [row["ping_id"] for row in opening] == [ping_id]


def test_only_a_step_of_the_callers_service_runs_in_its_transaction(runtime: Runtime) -> None:
    with runtime.database("probe").transaction() as tx:
        parent = _parent(runtime, tx)
        assert runs_local(steps.refuse, parent)
        assert not runs_local(pingpong.pong, parent)


# -- the local step's lock: held from before its savepoint to the caller's commit --------


def _lock_free(conn, key: str) -> bool:
    """Whether another session can take the step lock on ``key`` now (it gives it back at once: autocommit)."""
    return bool(scalar(conn, "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", key))


def test_a_refusing_local_step_keeps_its_lock_while_its_refusal_is_written_and_to_the_commit(
    runtime: Runtime, conn
) -> None:
    ping_id = uuid.uuid4()
    key = f"refuse:{ping_id}"
    free: list[bool] = []
    steps.WHILE_REFUSING[ping_id] = lambda: free.append(_lock_free(conn, key))
    with runtime.database("probe").transaction() as tx, outbox.held_until_commit(tx):
        done = run_local(
            _parent(runtime, tx),
            steps.refuse_locked,
            steps.RefuseLocked(ping_id),
            message_id=uuid.uuid4(),
            saga_id=uuid.uuid4(),
            options={},
        )
        free.append(_lock_free(conn, key))  # the rest of the caller's transaction
    assert done == LocalOutcome(ok=False, error=f"ping {ping_id} refused")
    # Another session could take the lock neither while the refusal was written nor after.
    assert free == [False, False]
    assert _lock_free(conn, key)  # the caller's commit released it
    assert [r[0] for r in conn.execute("SELECT ping_id FROM probe.pings").fetchall()] == [ping_id]


def test_the_order_stays_locked_until_the_reply_that_ran_its_refused_confirmation_commits(
    runtime: Runtime, conn, courier: Courier, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000)
    conn.execute("UPDATE orders.orders SET status = 'cancelled' WHERE order_id = %s", (placed.order_id,))
    hook = ORDER_SAGA.on_transition
    assert hook is not None
    free: dict[str, bool] = {}

    def watching(tx, transition) -> None:
        # The saga's move past the refused confirmation, in the reply's transaction.
        free[transition.event] = _lock_free(conn, str(placed.order_id))
        hook(tx, transition)

    monkeypatch.setattr(ORDER_SAGA, "on_transition", watching)
    courier.run()
    assert saga(conn, placed.saga_id).status == "failed"
    assert free["failed"] is False  # the confirmation's lock was still held by the reply's transaction
    assert _lock_free(conn, str(placed.order_id))
