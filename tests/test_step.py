"""The step: one transaction per message (inbox, change, outbox), on real PostgreSQL."""

from __future__ import annotations

import functools
import threading
import uuid
from pathlib import Path

import attrs
import psycopg
import pytest
from prometheus_client import REGISTRY

from estafeta import Runtime, deliver
from estafeta.steps import transaction as step_tx
from estafeta.steps.alone import DELIVERIES, Gate
from estafeta_actors.pingpong import Ping
from estafeta_sql import inbox
from tests.app import STEPS

from .events.test_wakeups import Heard
from .helpers import as_rabbitmq_delivers, message_for, now, scalar, wait_until
from .integration import processes
from .probe import SERVICE as probe
from .steps import ATTEMPTS, SENT, Crash, Explode, Hold, Refuse, SendThree, held

PING = STEPS["pingpong.ping"]
EXPLODE = STEPS["probe.test_explode"]
REFUSE = STEPS["probe.test_refuse"]
SEND_THREE = STEPS["probe.test_send_three"]
HOLD = STEPS["probe.test_hold"]


def test_a_step_s_sends_commit_in_the_order_sent_and_a_cancel_in_the_same_step_finds_its_message(
    runtime: Runtime, conn
) -> None:
    ping_id = uuid.uuid4()
    assert deliver(SEND_THREE, runtime, message_for("probe.test_send_three", SendThree(ping_id))) == "ok"
    first, _cancelled, third = SENT[ping_id]["sent"]  # type: ignore[misc]
    # Held until the commit, the sends were written before the cancel ran (and read).
    assert SENT[ping_id]["seen"] == [first, third]
    rows = conn.execute("SELECT message_id FROM probe.outbox ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [first, third]


def test_change_and_outgoing_message_commit_together(runtime: Runtime, conn) -> None:
    ping_id = uuid.uuid4()
    outcome = deliver(PING, runtime, message_for("pingpong.ping", Ping(ping_id, now())))
    assert outcome == "ok"
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE ping_id = %s", ping_id) == 1
    row = conn.execute("SELECT actor_name, message FROM pingpong.outbox").fetchone()
    assert row[0] == "pingpong.pong"
    assert row[1]["args"] == [{"ping_id": str(ping_id)}]
    assert row[1]["options"]["traceparent"].startswith("00-")


def test_exception_after_send_leaves_neither_change_nor_outbox_row(runtime: Runtime, conn) -> None:
    ping_id = uuid.uuid4()
    message = message_for("probe.test_explode", Explode(ping_id))
    with pytest.raises(RuntimeError, match="boom"):
        deliver(EXPLODE, runtime, message)
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings") == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0
    # The inbox record rolled back too, so the retry is not mistaken for a duplicate.
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox") == 0


def test_duplicate_delivery_changes_nothing(runtime: Runtime, conn) -> None:
    ping_id, message_id = uuid.uuid4(), uuid.uuid4()
    message = message_for("pingpong.ping", Ping(ping_id, now()), message_id=message_id)
    assert deliver(PING, runtime, message) == "ok"
    assert deliver(PING, runtime, message) == "duplicate"
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings") == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox_attempts") == 0


def test_a_first_delivery_on_rabbitmq_is_not_counted_and_a_message_that_keeps_dying_is_still_parked(
    runtime: Runtime, conn
) -> None:
    # RabbitMQ marks a message delivered before: its first delivery costs no count (nothing
    # can have died of it yet); each redelivery counts, including the first it follows.
    # With ESTAFETA_MAX_DELIVERIES=2 the third delivery is parked without running, as when
    # every delivery is counted. (Deliveries raising stand in for the kills of the heavy test.)
    limited = Runtime(attrs.evolve(runtime.settings, max_deliveries=2))
    ping_id = uuid.uuid4()
    message = message_for("probe.test_explode", Explode(ping_id))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            deliver(EXPLODE, limited, as_rabbitmq_delivers(message, redelivered=False))
        assert scalar(conn, "SELECT count(*) FROM probe.inbox_attempts") == 0
        with pytest.raises(RuntimeError, match="boom"):
            deliver(EXPLODE, limited, as_rabbitmq_delivers(message, redelivered=True))
        assert scalar(conn, "SELECT attempts FROM probe.inbox_attempts") == 1
        assert ATTEMPTS[ping_id] == 2
        assert deliver(EXPLODE, limited, as_rabbitmq_delivers(message, redelivered=True)) == "dead_lettered"
        assert ATTEMPTS[ping_id] == 2  # parked without running
        (letter,) = inbox.list_dead_letters(conn, "probe")
        assert "delivered 3 times without finishing" in letter["reason"]
    finally:
        limited.close()


def test_a_delivery_after_one_that_died_is_counted_only_once_it_runs_alone(runtime: Runtime, conn) -> None:
    # A kill is counted against every message in flight in the process it kills. So a copy
    # delivered again after a delivery that did not finish (here it raised; SIGKILLs in the
    # heavy tests) waits, uncounted, until nothing else runs in its process, then is counted
    # and runs alone: had it died waiting, the kill would not have been its own.
    alone_before = REGISTRY.get_sample_value("estafeta_step_deliveries_alone_total", {"actor": EXPLODE.actor_name})
    holder = uuid.uuid4()
    started, released = held(holder)
    beside = threading.Thread(target=deliver, args=(HOLD, runtime, message_for("probe.test_hold", Hold(holder))))
    beside.start()
    suspect: list[BaseException] = []
    again: threading.Thread | None = None
    try:
        assert started.wait(timeout=30), "the held delivery never started"
        ping_id = uuid.uuid4()
        message = message_for("probe.test_explode", Explode(ping_id))
        with pytest.raises(RuntimeError, match="boom"):
            deliver(EXPLODE, runtime, message)  # beside the held one: counted
        assert scalar(conn, "SELECT attempts FROM probe.inbox_attempts") == 1

        def deliver_again() -> None:
            try:
                deliver(EXPLODE, runtime, message)
            except BaseException as exc:
                suspect.append(exc)

        again = threading.Thread(target=deliver_again)
        again.start()
        wait_until(lambda: DELIVERIES.waiting_alone == 1, timeout=30, what="the suspect waiting to run alone")
        assert scalar(conn, "SELECT attempts FROM probe.inbox_attempts") == 1
        assert ATTEMPTS[ping_id] == 1
    finally:
        released.set()
        beside.join(timeout=30)
        if again is not None:
            again.join(timeout=30)
    assert scalar(conn, "SELECT count(*) FROM probe.pings WHERE ping_id = %s", holder) == 1
    (error,) = suspect
    assert "boom on attempt 2" in str(error)
    assert scalar(conn, "SELECT attempts FROM probe.inbox_attempts") == 2
    alone = REGISTRY.get_sample_value("estafeta_step_deliveries_alone_total", {"actor": EXPLODE.actor_name})
    assert (alone or 0) - (alone_before or 0) == 1


def test_a_suspect_waiting_to_run_alone_keeps_new_deliveries_out_until_it_has_run() -> None:
    gate = Gate()
    order: list[str] = []
    running = threading.Event()
    finish = threading.Event()

    def first() -> None:
        with gate.shared():
            running.set()
            finish.wait(timeout=30)
            order.append("first")

    def suspect() -> None:
        with gate.alone(), gate.shared():  # a thread inside passes its own gate
            order.append("suspect")

    def later() -> None:
        with gate.shared():
            order.append("later")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert running.wait(timeout=30)
    threads.append(threading.Thread(target=suspect))
    threads[1].start()
    wait_until(lambda: gate.waiting_alone == 1, timeout=30, what="the suspect waiting")
    threads.append(threading.Thread(target=later))
    threads[2].start()
    finish.set()
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["first", "suspect", "later"]


def test_a_retried_copy_on_rabbitmq_counts_the_copies_before_it(runtime: Runtime, conn) -> None:
    # Each of Dramatiq's retries is a new copy, first-delivered (uncounted) again: the last
    # one's dead letter still says how many deliveries there were in all.
    ping_id = uuid.uuid4()
    last = message_for("probe.test_explode", Explode(ping_id), retries=3)  # max_retries=3 in the tests
    assert deliver(EXPLODE, runtime, as_rabbitmq_delivers(last, redelivered=False)) == "dead_lettered"
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert "failed 4 times" in letter["reason"] and "boom" in letter["reason"]


@pytest.mark.parametrize(
    "handed", ["counted", "first delivery", "redelivered", "duplicate"], ids=lambda h: h.replace(" ", "-")
)
def test_under_after_commit_a_step_s_own_transaction_notifies_nothing(runtime: Runtime, conn, handed: str) -> None:
    # The inbox record's statement sets the transaction's wake-up policy, whichever variant
    # of it runs: the step's outbox insert is silent, the waker's connection wakes the relay.
    woken = Runtime(attrs.evolve(runtime.settings, wakeup="after-commit"))
    message = message_for("pingpong.ping", Ping(uuid.uuid4(), now()))
    heard = Heard(runtime.settings.database_url)
    try:
        if handed == "duplicate":
            assert deliver(PING, woken, message) == "ok"
            # The first delivery's wake-ups come from the waker's thread, after the commit:
            # heard before the duplicate's delivery, and forgotten.
            wait_until(
                lambda: {"estafeta_outbox", "estafeta_events"} <= {note[0] for note in heard.notes},
                timeout=5,
                what="the first delivery's wake-ups",
            )
            heard.notes.clear()
        if handed in ("first delivery", "redelivered"):
            outcome = deliver(PING, woken, as_rabbitmq_delivers(message, redelivered=handed == "redelivered"))
        else:
            outcome = deliver(PING, woken, message)
        assert outcome == ("duplicate" if handed == "duplicate" else "ok")
        if handed != "duplicate":
            wait_until(lambda: heard.senders("estafeta_outbox"), timeout=5, what="the relay's wake-up")
            assert heard.senders("estafeta_outbox") == {"estafeta-waker"}
    finally:
        heard.stop()
        woken.close()
    if handed == "duplicate":
        assert heard.notes == []


def test_concurrent_duplicates_take_effect_once(runtime: Runtime, conn) -> None:
    # Two workers receive the same message at the same instant: the second inbox insert
    # waits for the first transaction and then sees a duplicate.
    message = message_for("pingpong.ping", Ping(uuid.uuid4(), now()))
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        outcomes.append(deliver(PING, runtime, message))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["duplicate", "duplicate", "duplicate", "ok"]
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings") == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 1


def test_invalid_message_is_dead_lettered_once_with_its_reason(runtime: Runtime, conn) -> None:
    message = message_for("pingpong.ping", Ping(uuid.uuid4(), now()))
    message = message.copy(args=({"sent_at": "yesterday"},))
    assert deliver(PING, runtime, message) == "dead_lettered"
    assert deliver(PING, runtime, message) == "duplicate"
    reasons = [r["reason"] for r in inbox.list_dead_letters(conn, "pingpong")]
    assert len(reasons) == 1
    assert "pingpong.ping" in reasons[0] and "ping_id" in reasons[0]
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings") == 0


def test_message_id_that_is_not_a_uuid_is_dead_lettered(runtime: Runtime, conn) -> None:
    message = message_for("pingpong.ping", Ping(uuid.uuid4(), now())).copy(message_id="not-a-uuid")
    assert deliver(PING, runtime, message) == "dead_lettered"
    assert "not a UUID" in inbox.list_dead_letters(conn, "pingpong")[0]["reason"]


def test_business_failure_rolls_back_the_step_but_is_not_retried(runtime: Runtime, conn) -> None:
    message = message_for("probe.test_refuse", Refuse(uuid.uuid4()))
    assert deliver(REFUSE, runtime, message) == "failed"
    assert scalar(conn, "SELECT count(*) FROM probe.pings") == 0
    assert scalar(conn, "SELECT count(*) FROM probe.outbox") == 0
    assert scalar(conn, "SELECT count(*) FROM probe.inbox") == 1
    assert "not enough money" in inbox.list_dead_letters(conn, "probe")[0]["reason"]
    assert deliver(REFUSE, runtime, message) == "duplicate"


def test_business_failure_answers_the_sender_that_asked(runtime: Runtime, conn) -> None:
    reply_to = {"actor": "orders.saga_reply", "queue": "orders", "context": {"step": "charge", "version": 3}}
    message = message_for("probe.test_refuse", Refuse(uuid.uuid4()), reply_to=reply_to)
    assert deliver(REFUSE, runtime, message) == "failed"
    row = conn.execute("SELECT actor_name, message FROM probe.outbox").fetchone()
    assert row[0] == "orders.saga_reply"
    reply = row[1]["args"][0]
    assert reply["ok"] is False and reply["context"] == {"step": "charge", "version": 3}
    assert reply["in_reply_to"] == message.message_id
    assert "not enough money" in reply["error"]
    assert inbox.list_dead_letters(conn, "probe") == []


def test_transient_failure_is_retried_until_it_succeeds_once(runtime: Runtime, conn, stub_broker, stub_worker) -> None:
    ping_id = uuid.uuid4()
    stub_broker.enqueue(message_for("probe.test_explode", Explode(ping_id, times=2)))
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM probe.pings") == 1, what="the third attempt")
    stub_broker.join("probe", timeout=10_000)
    assert ATTEMPTS[ping_id] == 3
    assert scalar(conn, "SELECT count(*) FROM probe.outbox") == 1


def test_failing_every_retry_is_dead_lettered_and_not_lost(runtime: Runtime, conn, stub_broker, stub_worker) -> None:
    ping_id = uuid.uuid4()
    stub_broker.enqueue(message_for("probe.test_explode", Explode(ping_id)))
    wait_until(lambda: bool(inbox.list_dead_letters(conn, "probe")), what="the dead letter")
    stub_broker.join("probe", timeout=10_000)
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert "failed 4 times" in letter["reason"] and "boom" in letter["reason"]
    assert letter["message"]["args"] == [{"ping_id": str(ping_id), "times": -1}]
    assert ATTEMPTS[ping_id] == 4  # max_retries=3 in the tests' settings
    assert scalar(conn, "SELECT count(*) FROM probe.pings") == 0


def died_or_parked(workers: processes.Process, conn) -> bool:
    return workers.popen.poll() is not None or bool(inbox.list_dead_letters(conn, "probe"))


@pytest.mark.heavy
@pytest.mark.integration
def test_message_that_keeps_killing_its_worker_is_parked(
    database_url: str, amqp_url: str, runtime: Runtime, conn, tmp_path: Path
) -> None:
    # The step SIGKILLs the `dramatiq` worker process running it; RabbitMQ hands the message
    # to the next worker at once, and Dramatiq counts no retry. Deliveries are counted in
    # PostgreSQL before the work starts: past the limit the message is parked without running.
    env = processes.service_env(database_url, amqp_url, ESTAFETA_APP="tests.app", ESTAFETA_MAX_DELIVERIES="2")
    with conn.transaction():
        probe.send(conn, Crash(uuid.uuid4()))
    killed = 0
    with processes.running(processes.relay(env, tmp_path)):
        while not inbox.list_dead_letters(conn, "probe"):
            workers = processes.workers(env, tmp_path, module="tests.worker", threads=1)
            with processes.running(workers):
                wait_until(
                    functools.partial(died_or_parked, workers, conn),
                    timeout=60,
                    what="a worker killed by its message, or the message parked",
                )
                if workers.popen.poll() is not None:
                    # dramatiq exits 1 when a worker process died of a signal (its log line
                    # saying so can be lost: its log watcher stops before draining its pipe).
                    assert workers.popen.returncode == 1
                    killed += 1
                    # A redelivery is counted before its work starts, and the count survives
                    # the killed worker; the first delivery (not marked redelivered by
                    # RabbitMQ) is not counted, the redelivery after it counts it.
                    assert (scalar(conn, "SELECT attempts FROM probe.inbox_attempts") or 0) == killed - 1
            assert killed <= 2, "the message was not parked after ESTAFETA_MAX_DELIVERIES"
    assert killed == 2
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert "delivered 3 times without finishing (does it kill its worker?)" in letter["reason"]
    assert scalar(conn, "SELECT count(*) FROM probe.inbox_attempts") == 0


def test_worker_keeps_serving_after_a_malformed_message(runtime: Runtime, conn, stub_broker, stub_worker) -> None:
    bad = message_for("pingpong.ping", Ping(uuid.uuid4(), now())).copy(args=("not an object",))
    stub_broker.enqueue(bad)
    good_id = uuid.uuid4()
    stub_broker.enqueue(message_for("pingpong.ping", Ping(good_id, now())))
    stub_broker.join("pingpong", timeout=10_000)
    assert scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE ping_id = %s", good_id) == 1
    assert len(inbox.list_dead_letters(conn, "pingpong")) == 1


def test_a_refusal_rolls_back_the_work_and_keeps_the_connection_s_prepared_statements(database_url: str) -> None:
    # psycopg forgets a connection's prepared statements after any command answering
    # ROLLBACK, which ROLLBACK TO SAVEPOINT does; a refusal must not make it forget them.
    prepared = "SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, 'pingpong.inbox') > 0"
    with psycopg.connect(database_url, autocommit=True) as conn:
        counting = "SELECT count(*) FROM pingpong.inbox WHERE message_id = %s"
        for _ in range(6):  # prepared from the sixth execution on (psycopg's prepare_threshold)
            conn.execute(counting, (uuid.uuid4(),))
        assert scalar(conn, prepared) == 1
        message_id = uuid.uuid4()
        conn.execute("BEGIN")
        conn.execute(f"SAVEPOINT {step_tx.SAVEPOINT}")
        inbox.record(conn, "pingpong", "pingpong.ping", message_id)
        step_tx.roll_back_work(conn)
        conn.execute("COMMIT")
        assert scalar(conn, counting, message_id) == 0  # the work is undone
        assert scalar(conn, prepared) == 1  # psycopg's clearing would have sent DEALLOCATE ALL by now
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            step_tx.roll_back_work(conn)  # an error is raised as psycopg raises it
