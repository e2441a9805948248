"""Hand-offs (``ESTAFETA_HANDOFFS``): a step's one message run by the next step in the same worker thread.

Real PostgreSQL, the StubBroker and a Dramatiq worker in this process. The row stays the
message's only record until the next step's transaction deletes it: a relay that holds it,
an older row of its key, or a hand-off that fails leaves it to the relays, and nothing is
run twice or lost. (The SIGKILL case: tests/integration/test_saga_kill.py.)
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker
from prometheus_client import REGISTRY

from estafeta import Runtime, Settings, Watchdog
from estafeta.app.clock import Clock
from estafeta.messaging import handoff as handoff
from estafeta.steps.delivery import deliver
from estafeta.steps.outcome import Outcome
from estafeta.testing import TEST_SETTINGS
from estafeta_actors import pingpong
from estafeta_actors.order_saga import ORDER_SAGA, reconcile
from estafeta_brokers.relay import Relay
from estafeta_cli.demo_harness import DuplicatingPublisher
from estafeta_cli.seed import plan_orders
from estafeta_sql.outbox import WAKE_CHANNEL

from . import steps
from .app import app as tests_app
from .conftest import APPS, bound_broker, make_relay, relay_running, started_worker
from .helpers import message_for, scalar, wait_until
from .shop import place, seed
from .steps import SendBeforeHandOff


@pytest.fixture
def handing(runtime: Runtime, database_url: str, request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """A runtime (on the emptied database) whose steps hand off up to 8 messages in a row (or the param's)."""
    handoffs = getattr(request, "param", 8)
    handing = Runtime(Settings(database_url=database_url, handoffs=handoffs, **TEST_SETTINGS))  # type: ignore[arg-type]
    yield handing
    handing.close()


@pytest.fixture
def handing_broker(handing: Runtime) -> Iterator[StubBroker]:
    yield from bound_broker(handing)


@pytest.fixture
def handing_worker(handing_broker: StubBroker) -> Iterator[dramatiq.Worker]:
    yield from started_worker(handing_broker)


@pytest.fixture
def handing_relay(handing: Runtime, handing_broker: StubBroker) -> Iterator[Relay]:
    yield from relay_running(make_relay(handing, handing_broker))


def _handoffs(actor: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("estafeta_step_handoffs_total", {"actor": actor, "outcome": outcome}) or 0.0


def test_a_pong_goes_straight_to_its_step_and_no_relay_publishes_it(
    handing: Runtime, handing_broker: StubBroker, handing_worker, conn
) -> None:
    assert handing.queues_here is None  # a worker for every queue
    done_before = _handoffs("pingpong.pong", "done")
    with handing.database("pingpong").transaction() as tx:
        ping_id = pingpong.send_ping(tx)
    # The relay publishes the ping once, then never runs again: the pong has no other way.
    # (pingpong's outbox only: the worker fires the ticker's schedules meanwhile.)
    assert make_relay(handing, handing_broker, services=["pingpong"]).drain_once() == 1
    wait_until(lambda: pingpong.ping_status(conn, ping_id) == (True, 1), what="the pong's effect, once")
    handing_broker.join("pingpong")
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox WHERE consumer = 'pingpong.pong'") == 1
    assert _handoffs("pingpong.pong", "done") == done_before + 1


def test_a_worker_consuming_some_queues_hands_off_only_to_their_steps(
    handing: Runtime, handing_broker: StubBroker, conn
) -> None:
    # As `dramatiq estafeta_actors --queues payments` starts it: every step is declared in the process,
    # but the orchestrator's steps are for the workers that consume the orders queue.
    worker = dramatiq.Worker(handing_broker, worker_timeout=50, worker_threads=2, queues={"payments"})
    worker.start()
    try:
        assert handing.queues_here == frozenset({"payments"})
        done_before = _handoffs("orders.saga_order_reply", "done")
        seed(handing, {"c1": 10_000}, {"sku-1": 10})
        order_id = place(handing, "c1", "sku-1", 1, 500).order_id
        # The charge, to the payments queue. (One outbox per relay: the worker fires the
        # test app's schedules meanwhile.)
        assert make_relay(handing, handing_broker, services=["orders"]).drain_once() == 1
        paid = "SELECT count(*) FROM payments.payments WHERE order_id = %s AND status = 'charged'"
        wait_until(lambda: scalar(conn, paid, order_id) == 1, what="the charge, by this worker")
        handing_broker.join("payments")
        worker.join()
    finally:
        worker.stop()
    # The charge's reply was not run here: its row went to the relays, unleased, and they
    # publish it on the orders queue.
    assert _handoffs("orders.saga_order_reply", "done") == done_before
    assert scalar(conn, "SELECT count(*) FROM payments.outbox WHERE attempts >= 0") == 1
    assert make_relay(handing, handing_broker, services=["payments"]).drain_once() == 1
    (reply,) = _queued(handing_broker, "orders")
    assert reply.actor_name == "orders.saga_order_reply"


def test_rows_written_before_the_handed_off_one_wake_the_relays(
    handing: Runtime, handing_broker: StubBroker, database_url: str, conn
) -> None:
    assert handing.wakes_after_commit
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKE_CHANNEL}")
        message = message_for("probe.test_send_before_handoff", SendBeforeHandOff(uuid.uuid4()))
        assert deliver(handing.steps_here["probe.test_send_before_handoff"], handing, message) is Outcome.OK
        baton = handoff.take()
        assert baton is not None and baton.message.actor_name == "pingpong.pong"
        # The first pong's row is due now and no relay had been told: the waker tells them.
        woken = [note.payload for note in listener.notifies(timeout=60, stop_after=1)]
    assert woken == ["probe"]
    assert scalar(conn, "SELECT count(*) FROM probe.outbox WHERE attempts = 0") == 1  # the first pong, for a relay


def _queued(broker: StubBroker, queue: str) -> list[dramatiq.Message]:
    waiting = broker.queues[queue]
    return [dramatiq.Message.decode(waiting.get_nowait()) for _ in range(waiting.qsize())]


def _pong_offered(handing: Runtime, broker: StubBroker, relay: Relay) -> tuple[uuid.UUID, handoff.Baton]:
    """A ping relayed and delivered outside a worker: its pong's row leased and offered, never run; (ping id, baton)."""
    with handing.database("pingpong").transaction() as tx:
        ping_id = pingpong.send_ping(tx)
    assert relay.drain_once() == 1
    (ping,) = _queued(broker, "pingpong")
    assert deliver(pingpong.ping, handing, ping) is Outcome.OK
    baton = handoff.take()
    assert baton is not None and baton.message.actor_name == "pingpong.pong"
    return ping_id, baton


def test_a_handed_off_row_is_leased_from_the_relays_and_holds_back_its_key(
    handing: Runtime, handing_broker: StubBroker, conn
) -> None:
    relay = make_relay(handing, handing_broker)
    ping_id, baton = _pong_offered(handing, handing_broker, relay)
    # A later row of the same key, as any sender writes it: it waits behind the leased one.
    with handing.database("pingpong").transaction() as tx:
        later = pingpong.SERVICE.send(tx, pingpong.Pong(ping_id), ordering_key=str(ping_id))
    assert relay.drain_once() == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 2
    # Released (what a failed hand-off does): both go, in their key's order.
    handoff.release(baton)
    assert relay.drain_once() == 2
    assert [m.message_id for m in _queued(handing_broker, "pingpong")] == [baton.message.message_id, str(later)]


def test_releasing_a_row_a_relay_holds_leaves_it_to_the_relay_without_waiting(
    handing: Runtime, handing_broker: StubBroker, conn
) -> None:
    _, baton = _pong_offered(handing, handing_broker, make_relay(handing, handing_broker))
    with psycopg.connect(conn.info.dsn) as relay_conn:
        # A relay's claim after the lease ended: the row is the relay's until it commits.
        relay_conn.execute(
            "SELECT id FROM pingpong.outbox WHERE message_id = %s FOR UPDATE", (baton.message.message_id,)
        )
        released = threading.Thread(target=handoff.release, args=(baton,), daemon=True)
        released.start()
        released.join(timeout=10)
        assert not released.is_alive(), "the release waited for the relay's row lock"
    # Skipped, not released: the row is still leased (the relay would have published it).
    assert scalar(conn, "SELECT attempts FROM pingpong.outbox") == -1


def test_a_row_whose_handoff_never_ran_goes_to_the_relays_when_its_lease_ends(
    handing: Runtime, handing_broker: StubBroker, conn
) -> None:
    relay = make_relay(handing, handing_broker)
    # The worker dies here: the hand-off is never run, the row never released.
    _, baton = _pong_offered(handing, handing_broker, relay)
    assert relay.drain_once() == 0
    clock = Clock(handing, ["pingpong"])
    try:
        clock.advance(handoff.LEASE + timedelta(seconds=1))
        assert relay.drain_once() == 1
    finally:
        clock.reset()
    assert [m.message_id for m in _queued(handing_broker, "pingpong")] == [baton.message.message_id]
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


def _pong_row(runtime: Runtime, conn: psycopg.Connection, *, key: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A pong waiting in pingpong's outbox for a recorded ping; (ping id, message id)."""
    ping_id = uuid.uuid4()
    conn.execute("INSERT INTO pingpong.pings (ping_id, sent_at) VALUES (%s, %s)", (ping_id, datetime.now(UTC)))
    with runtime.database("pingpong").transaction() as tx:
        message_id = pingpong.SERVICE.send(tx, pingpong.Pong(ping_id), ordering_key=key)
    return ping_id, message_id


def test_a_handoff_leaves_a_row_a_relay_holds_and_takes_it_once_free(runtime: Runtime, conn) -> None:
    spec = pingpong.pong
    ping_id, message_id = _pong_row(runtime, conn, key="k1")
    message = message_for(spec.actor_name, pingpong.Pong(ping_id), message_id=message_id)
    with psycopg.connect(conn.info.dsn) as relay_conn:
        # A relay's claim: the row locked until its publish is confirmed and the row deleted.
        relay_conn.execute("SELECT id FROM pingpong.outbox WHERE message_id = %s FOR UPDATE", (message_id,))
        assert deliver(spec, runtime, message, handoff_from="pingpong") is Outcome.RELAYED
    assert pingpong.ping_status(conn, ping_id) == (False, 0)
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox WHERE message_id = %s", message_id) == 0
    assert deliver(spec, runtime, message, handoff_from="pingpong") is Outcome.OK
    assert pingpong.ping_status(conn, ping_id) == (True, 1)
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0
    # Once the row is gone, so is the hand-off: the relay (or an earlier hand-off) sent it.
    assert deliver(spec, runtime, message, handoff_from="pingpong") is Outcome.RELAYED
    assert pingpong.ping_status(conn, ping_id) == (True, 1)


def test_a_handoff_waits_behind_an_older_row_of_its_key(runtime: Runtime, conn) -> None:
    spec = pingpong.pong
    older, _ = _pong_row(runtime, conn, key="same")
    ping_id, message_id = _pong_row(runtime, conn, key="same")
    message = message_for(spec.actor_name, pingpong.Pong(ping_id), message_id=message_id)
    assert deliver(spec, runtime, message, handoff_from="pingpong") is Outcome.RELAYED
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 2
    # Another key's row is not in its way.
    other, other_id = _pong_row(runtime, conn, key="other")
    message = message_for(spec.actor_name, pingpong.Pong(other), message_id=other_id)
    assert deliver(spec, runtime, message, handoff_from="pingpong") is Outcome.OK
    assert pingpong.ping_status(conn, other) == (True, 1)
    assert pingpong.ping_status(conn, older) == (False, 0)


def test_a_handoff_that_fails_goes_back_to_the_relay_and_takes_effect_once(
    handing: Runtime, handing_broker: StubBroker, handing_worker, handing_relay, conn
) -> None:
    failed_before = _handoffs("probe.test_explode", "failed")
    ping_id = uuid.uuid4()
    with handing.database("probe").transaction() as tx:
        tests_app.service("probe").send(tx, steps.PassOn(ping_id, times=1))
    # The hand-off's first attempt fails and rolls back; the relay publishes the row and
    # Dramatiq's delivery does the work, once.
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pingpong.inbox WHERE consumer = 'pingpong.pong'") == 1,
        what="the pong after the explode's second attempt",
    )
    assert steps.ATTEMPTS[ping_id] == 2
    assert scalar(conn, "SELECT count(*) FROM probe.pings WHERE ping_id = %s", ping_id) == 1
    assert _handoffs("probe.test_explode", "failed") == failed_before + 1
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM probe.outbox") == 0, what="probe's outbox drained")


@pytest.mark.parametrize("handing", [8, 2], indirect=True, ids=["8-in-a-row", "2-in-a-row"])
def test_the_order_saga_by_handoffs_ends_every_saga_despite_duplicates(
    handing: Runtime, handing_broker: StubBroker, handing_worker, conn
) -> None:
    # 8 hand-offs in a row: all but the first of a saga's step messages may go by hand. With 2,
    # every third goes back to the relays (released past the limit), and every saga still ends.
    relay = make_relay(handing, handing_broker)
    publisher = DuplicatingPublisher(relay.publisher, every=3)
    relay.publisher = publisher
    watchdog = Watchdog(handing, [ORDER_SAGA])
    stop = threading.Event()
    threads = [
        threading.Thread(target=relay.run, args=(stop,), daemon=True),
        threading.Thread(target=watchdog.run, args=(stop, 0.05), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        before = sum(_handoffs(s, "done") for s in _ORDER_STEPS)
        plan = plan_orders(40, rng=random.Random(7))
        seed(handing, plan.balances, plan.stock)
        order_ids = [place(handing, c, s, q, a).order_id for c, s, q, a in plan.orders]
        ended = "SELECT count(*) FROM orders.saga_order WHERE completed_at IS NOT NULL"
        wait_until(lambda: scalar(conn, ended) == len(order_ids), timeout=60, what="every saga ended")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    check = reconcile(handing, order_ids, plan.balances, plan.stock)
    assert check.ok, check
    assert set(check.sagas) == {"completed", "compensated"}, check.sagas
    assert scalar(conn, "SELECT count(*) FROM notifications.sent") == len(order_ids)
    # The relay published the first commands (and copies of some); most of the rest went by hand.
    handed = sum(_handoffs(s, "done") for s in _ORDER_STEPS) - before
    assert handed >= min(4, handing.settings.handoffs) * len(order_ids), handed
    assert scalar(conn, "SELECT count(*) FROM orders.outbox") == 0


#: The order saga's steps, its orchestrator's reply step included.
_ORDER_STEPS = [
    name
    for app in APPS
    for service in app.services
    if service.name in {"orders", "payments", "inventory", "notifications"}
    for name in service.steps
]
