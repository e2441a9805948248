"""The saga watchdog never dies: a saga it cannot move on is recorded on its row, and the others go on."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from estafeta import Runtime, Saga, Watchdog
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_sql import sagas
from estafeta_sql.sagas import SagaRow

from .helpers import wait_until
from .probe_sagas import TWICE, Probe
from .shop import Courier, place, saga, seed


@pytest.fixture
def watching(runtime: Runtime) -> Iterator[threading.Thread]:
    """The watchdog of every saga kind running in a thread, as in a worker process."""
    watchdog = Watchdog(runtime, [ORDER_SAGA, TWICE])
    stop = threading.Event()
    thread = threading.Thread(target=watchdog.run, args=(stop, 0.05), daemon=True)
    yield thread
    stop.set()
    thread.join(10)


def overdue(conn, saga: Saga, saga_id: uuid.UUID, seconds: int) -> None:
    """Put the saga's deadline ``seconds`` in the past (the most overdue is listed first)."""
    conn.execute(
        f"UPDATE {saga.table.schema}.{saga.table.table} SET deadline_at = now() - make_interval(secs => %s)"
        " WHERE saga_id = %s",
        (seconds, saga_id),
    )


def undecodable_payload(runtime: Runtime, conn) -> tuple[Saga, uuid.UUID]:
    # A deploy changed the data class: the stored payload no longer fits it.
    broken = place(runtime, "c2", "s1", 1, 100).saga_id
    conn.execute("UPDATE orders.saga_order SET payload = '{\"order_id\": 42}' WHERE saga_id = %s", (broken,))
    return ORDER_SAGA, broken


def renamed_step(runtime: Runtime, conn) -> tuple[Saga, uuid.UUID]:
    # A deploy renamed the step this saga waits on.
    broken = place(runtime, "c2", "s1", 1, 100).saga_id
    conn.execute("UPDATE orders.saga_order SET current_step = 'charge_card' WHERE saga_id = %s", (broken,))
    return ORDER_SAGA, broken


def two_handlers(runtime: Runtime, conn) -> tuple[Saga, uuid.UUID]:
    # A deploy added a second step handling the command this saga waits to send again.
    with runtime.database("probe").transaction() as tx:
        broken = TWICE.start(tx, Probe(uuid.uuid4()))
    conn.execute("UPDATE probe.saga_twice SET current_step = 'second' WHERE saga_id = %s", (broken,))
    return TWICE, broken


TRIGGERS: dict[str, Callable[[Runtime, object], tuple[Saga, uuid.UUID]]] = {
    "undecodable payload": undecodable_payload,
    "renamed step": renamed_step,
    "command with two handlers": two_handlers,
}


def row_of(runtime: Runtime, saga: Saga, saga_id: uuid.UUID) -> SagaRow:
    with runtime.database(saga.service).connection() as conn:
        row = sagas.get(conn, saga.table, saga_id)
    assert row is not None
    return row


@pytest.mark.parametrize("trigger", list(TRIGGERS))
def test_a_saga_the_watchdog_cannot_move_on_is_failed_with_the_reason_and_the_others_go_on(
    runtime: Runtime, conn, watching: threading.Thread, trigger: str
) -> None:
    seed(runtime, {"c1": 10_000, "c2": 10_000}, {"s1": 5})
    healthy = place(runtime, "c1", "s1", 1, 100).saga_id
    kind, broken = TRIGGERS[trigger](runtime, conn)
    overdue(conn, ORDER_SAGA, healthy, 10)
    overdue(conn, kind, broken, 60)  # the most overdue: every watchdog meets it first
    watching.start()
    wait_until(lambda: saga(conn, healthy).attempts == 2, timeout=10, what="the healthy saga's command sent again")
    wait_until(lambda: row_of(runtime, kind, broken).status == "failed", timeout=10, what="the broken saga failed")
    row = row_of(runtime, kind, broken)
    assert row.last_error is not None and row.last_error.startswith("watchdog: ")
    assert row.deadline_at is None
    events = [(e.event, e.status) for e in sagas.timeline(conn, kind.table, broken)]
    assert events[-1] == ("failed", "failed")
    # Still watching: a saga that falls due later is moved on too.
    later = place(runtime, "c1", "s1", 1, 100).saga_id
    overdue(conn, ORDER_SAGA, later, 1)
    wait_until(lambda: saga(conn, later).attempts == 2, timeout=10, what="a later saga moved on")
    assert watching.is_alive()


def test_a_saga_failed_by_a_renamed_step_finishes_once_resumed_after_the_fix(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000, "c2": 10_000}, {"s1": 5})
    _, broken = renamed_step(runtime, conn)
    overdue(conn, ORDER_SAGA, broken, 1)
    assert Watchdog(runtime, [ORDER_SAGA]).check_once() == {"failed": 1}
    assert "charge_card" in (saga(conn, broken).last_error or "")
    # The fix: the step's old name is back (or the row is moved to the new name), then resume.
    conn.execute("UPDATE orders.saga_order SET current_step = 'charge_payment' WHERE saga_id = %s", (broken,))
    with runtime.database("orders").transaction() as tx:
        assert ORDER_SAGA.resume(tx, broken) == "retrying"
    Courier(runtime, conn).run()
    assert saga(conn, broken).status == "completed"


def test_an_unexpected_error_is_recorded_and_the_saga_looked_at_again_later(
    runtime: Runtime, conn, watching: threading.Thread
) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    healthy = place(runtime, "c1", "s1", 1, 100).saga_id
    with runtime.database("probe").transaction() as tx:
        buggy = TWICE.start(tx, Probe(uuid.uuid4()), step_timeout=60)
    conn.execute("UPDATE probe.saga_twice SET payload = payload || '{\"broken\": true}' WHERE saga_id = %s", (buggy,))
    overdue(conn, TWICE, buggy, 60)
    overdue(conn, ORDER_SAGA, healthy, 10)
    watching.start()
    wait_until(lambda: saga(conn, healthy).attempts == 2, timeout=10, what="the healthy saga's command sent again")
    row = row_of(runtime, TWICE, buggy)
    # Maybe the bug is fixed by the next deploy: the saga stays live, looked at again a step timeout later.
    assert row.status == "running"
    assert row.last_error == "watchdog: RuntimeError: the command factory of step first has a bug"
    assert row.deadline_at is not None and row.deadline_at > row.updated_at
    assert watching.is_alive()
