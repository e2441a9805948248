"""Quorum queues on the real RabbitMQ: declarations, refusals, the delivery limit, and redeclaring.

``ESTAFETA_RABBITMQ_QUEUE_TYPE=quorum`` makes the workers' broker and the relay declare
every queue as a quorum queue (test_wire_format.py checks both declare the same, and the
bytes). Here: a queue RabbitMQ holds with other arguments is one line naming both sides
and stops a worker; priorities are refused, not dropped; ``x-delivery-limit`` lets the
inbox see the delivery past ``ESTAFETA_MAX_DELIVERIES``; and ``estafeta queues
redeclare`` turns classic queues holding messages into quorum queues without losing one.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dramatiq
import pika
import pika.exceptions
import psycopg
import pytest
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, RabbitmqBroker

from estafeta_actors.kill_and_recover import KillAndRecover, Plan
from estafeta_brokers import broker_from_url, rabbitmq_redeclare
from estafeta_brokers.publish import publisher_for, to_message
from estafeta_brokers.rabbitmq_queues import (
    QueueDeclarations,
    QueueMismatch,
    QueueTypedRabbitmqBroker,
    check_quorum_arguments,
)
from estafeta_brokers.rabbitmq_redeclare import HOLDING_SUFFIX, Action, RedeclareRefused, redeclare_queues
from estafeta_sql import inbox
from estafeta_sql.outbox import OutboxRow
from examples.welcome import app as welcome_app

from ..helpers import scalar, wait_until
from ..probe import SERVICE as probe
from ..services import rabbitmq_messages, rabbitmq_queues, rabbitmq_vhost
from ..steps import Crash, Explode, Linger
from . import processes
from .processes import BIN, ROOT, service_env

pytestmark = pytest.mark.integration


@pytest.fixture
def vhost() -> Iterator[str]:
    """A vhost of this test's own: queue names the test does not choose (an app's) start empty."""
    with rabbitmq_vhost(f"estafeta-quorum-{uuid.uuid4().hex[:8]}") as url:
        yield url


def _row(queue: str, seq: int = 1, **options: Any) -> OutboxRow:
    return OutboxRow(
        id=seq,
        message_id=uuid.uuid4(),
        queue_name=queue,
        actor_name=f"{queue}.record",
        message={"args": [{"seq": seq}], "kwargs": {}, "options": options},
        ordering_key=None,
        saga_id=None,
        created_at=datetime.now(UTC),
        attempts=0,
    )


def _one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text


def test_classic_declarations_are_dramatiqs_own() -> None:
    """``classic`` declares exactly what an unmodified Dramatiq broker does: existing queues stay valid."""
    for max_priority in (None, 7):
        theirs = RabbitmqBroker(url="amqp://127.0.0.1:1/", max_priority=max_priority)
        ours = QueueDeclarations(max_priority=max_priority).of("orders")
        assert ours[0][1] == theirs._build_queue_arguments("orders")
        assert ours[1] == ("orders.DQ", theirs._build_queue_arguments("orders"))
        assert ours[2] == ("orders.XQ", {"x-message-ttl": DEAD_MESSAGE_TTL})


def test_priorities_and_arguments_quorum_queues_do_not_take_are_refused(amqp_url: str) -> None:
    with pytest.raises(ValueError, match=r"quorum queues take no priorities: max_priority=5 \(x-max-priority\)"):
        broker_from_url(amqp_url, queue_type="quorum", max_priority=5)
    with pytest.raises(ValueError, match=r"cannot take the argument\(s\) x-max-priority, x-queue-mode"):
        check_quorum_arguments("orders", {"x-queue-mode": "lazy", "x-max-priority": 3, "x-delivery-limit": 5})
    with pytest.raises(ValueError, match="a delivery limit needs quorum queues"):
        QueueDeclarations(delivery_limit=5)
    with pytest.raises(ValueError, match="unknown queue type 'mirrored'"):
        QueueDeclarations("mirrored")
    # A message's priority, which a quorum queue would silently ignore: refused on both paths.
    queue = f"prio-{uuid.uuid4().hex[:6]}"
    broker = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=3)
    publisher = publisher_for(broker)
    try:
        row = _row(queue, broker_priority=2)
        with pytest.raises(ValueError, match=f"has a broker_priority, but queue '{queue}' is a quorum queue"):
            broker.enqueue(to_message(row))
        plain = _row(queue, 2)
        outcome = publisher.publish([row, plain])
        assert outcome.confirmed == [plain.id]
        assert outcome.failed == {row.id: f"outbox row 1 has a broker_priority, but queue '{queue}' is a quorum queue"
                                  ", which has no priorities"}  # fmt: skip
    finally:
        publisher.close()
        broker.close()


def test_a_queue_declared_with_other_arguments_is_one_line_naming_both(amqp_url: str) -> None:
    queue = f"mismatch-{uuid.uuid4().hex[:6]}"
    classic = broker_from_url(amqp_url)
    quorum = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=25)
    publisher = publisher_for(quorum)
    try:
        classic.declare_queue(queue, ensure=True)
        with pytest.raises(QueueMismatch) as raised:
            quorum.declare_queue(queue, ensure=True)
        message = _one_line(str(raised.value))
        assert message.startswith(f"queue '{queue}' exists on RabbitMQ with other arguments than estafeta declares")
        ours = f"(quorum: x-dead-letter-exchange='', x-dead-letter-routing-key='{queue}.XQ', x-delivery-limit=25,"
        assert ours + " x-queue-type='quorum')" in message
        assert "received the value 'quorum' of type 'longstr' but current is none" in message  # RabbitMQ's side
        # The relay's refusal is the same line, on the row (the other rows go on).
        row = _row(queue)
        assert publisher.publish([row]).failed == {row.id: message}
        # And the other way round: a classic broker against the quorum queues of a migrated deployment.
        quorum.declare_queue(f"{queue}-q", ensure=True)
        with pytest.raises(QueueMismatch, match="received none but current is the value 'quorum'"):
            classic.declare_queue(f"{queue}-q", ensure=True)
    finally:
        publisher.close()
        for broker in (classic, quorum):
            broker.close()


def test_a_worker_whose_queues_exist_with_other_arguments_stops_at_once_with_one_line(
    vhost: str, database_url: str
) -> None:
    classic = broker_from_url(vhost)
    queues = sorted({spec.queue_name for spec in welcome_app.steps.values()})
    try:
        for queue in queues:
            classic.declare_queue(queue, ensure=True)
    finally:
        classic.close()
    env = service_env(database_url, vhost, ESTAFETA_RABBITMQ_QUEUE_TYPE="quorum")
    result = subprocess.run(
        [str(BIN / "dramatiq"), "examples.welcome", "--processes", "1", "--threads", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("estafeta:")]
    assert len(lines) == 1, result.stderr
    assert f"queue '{queues[0]}' exists on RabbitMQ with other arguments" in lines[0]
    assert "RabbitMQ says: PRECONDITION_FAILED" in lines[0]


def _deliveries_until_gone(url: str, queue: str) -> int:
    """Take the message and drop the connection without an ack (a killed worker), until RabbitMQ stops delivering."""
    deliveries = 0
    while deliveries < 50:
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            method, _properties, _body = connection.channel().basic_get(queue, auto_ack=False)
        if method is None:
            return deliveries
        deliveries += 1
    raise AssertionError("still delivered after 50 returns")


def test_the_delivery_limit_lets_the_inbox_park_the_message_itself(amqp_url: str) -> None:
    """The inbox parks a message at delivery ``ESTAFETA_MAX_DELIVERIES + 1``: RabbitMQ must still make it.

    ``x-delivery-limit`` = ``ESTAFETA_MAX_DELIVERIES``: RabbitMQ delivers a message that kills its
    worker exactly max + 1 times, then dead-letters it into ``.XQ`` (the backstop, when the inbox
    could not count).
    """
    max_deliveries = 3
    queue = f"limit-{uuid.uuid4().hex[:6]}"
    broker = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=max_deliveries)
    try:
        broker.enqueue(to_message(_row(queue)))
        assert _deliveries_until_gone(amqp_url, queue) == max_deliveries + 1
        assert broker.get_queue_message_counts(queue)[2] == 1  # in .XQ, not dropped
    finally:
        broker.close()


def _fill_classic_queues(url: str, queue: str) -> Counter[bytes]:
    """Messages in ``queue``, its ``.DQ`` and its ``.XQ``, as Dramatiq puts them there; their bodies."""
    broker = broker_from_url(url)
    bodies: Counter[bytes] = Counter()
    try:
        for seq in range(40):
            message = broker.enqueue(to_message(_row(queue, seq)), delay=60_000 if seq % 4 == 0 else None)
            bodies[message.encode()] += 1
        broker.channel.basic_publish("", f"{queue}.XQ", b"a dead message", pika.BasicProperties(delivery_mode=2))
        bodies[b"a dead message"] += 1
    finally:
        broker.close()
    return bodies


def _drain(url: str, queue: str) -> Counter[bytes]:
    bodies: Counter[bytes] = Counter()
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            while True:
                method, _properties, body = channel.basic_get(name, auto_ack=True)
                if method is None:
                    break
                bodies[body] += 1
    return bodies


def test_redeclare_turns_classic_queues_holding_messages_into_quorum_queues_losing_none(amqp_url: str) -> None:
    queue = f"migrate-{uuid.uuid4().hex[:6]}"
    bodies = _fill_classic_queues(amqp_url, queue)
    broker = broker_from_url(amqp_url, queue_type="quorum", delivery_limit=25)
    assert isinstance(broker, QueueTypedRabbitmqBroker)
    try:
        done = redeclare_queues([pika.URLParameters(amqp_url)], broker.declarations, [queue])
        assert [(d.name, d.action, d.moved) for d in done] == [
            (queue, Action.REDECLARED, 30),
            (f"{queue}.DQ", Action.REDECLARED, 10),
            (f"{queue}.XQ", Action.REDECLARED, 1),
        ]  # fmt: skip
        on_server = rabbitmq_queues(amqp_url)
        for name, arguments in broker.declarations.of(queue):
            assert on_server[name] == ("quorum", arguments)
            assert name + HOLDING_SUFFIX not in on_server
        broker.declare_queue(queue, ensure=True)  # the workers' declaration now agrees
        # Run again: nothing to do.
        again = redeclare_queues([pika.URLParameters(amqp_url)], broker.declarations, [queue])
        assert [(d.action, d.moved) for d in again] == [(Action.UNCHANGED, 0)] * 3
        assert _drain(amqp_url, queue) == bodies
    finally:
        broker.close()


def _drain_with_holding(url: str, queue: str) -> Counter[bytes]:
    """The bodies in ``queue``, its ``.DQ`` and ``.XQ``, and their holding queues (those that exist)."""
    bodies: Counter[bytes] = Counter()
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            for each in (name, name + HOLDING_SUFFIX):
                channel = connection.channel()
                try:
                    while (got := channel.basic_get(each, auto_ack=True))[0] is not None:
                        bodies[got[2]] += 1
                except pika.exceptions.ChannelClosedByBroker:
                    continue  # no such queue
                channel.close()
    return bodies


def _publishing_meanwhile(url: str, queue: str, bodies: Counter[bytes]) -> Callable[..., Any]:
    """A stand-in for a relay still running: one more message to ``queue`` each time it is called."""

    def publish(*_: Any) -> None:
        body = b"published meanwhile %d" % sum(bodies.values())
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            connection.channel().basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        bodies[body] += 1

    return publish


def test_a_message_published_between_the_emptiness_check_and_the_delete_is_not_lost(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"racing-{uuid.uuid4().hex[:6]}"
    bodies = _fill_classic_queues(amqp_url, queue)
    publish = _publishing_meanwhile(amqp_url, queue, bodies)
    checked = rabbitmq_redeclare._passive

    def then_publish(connection: Any, name: str) -> Any:
        found = checked(connection, name)  # what the queue held when asked...
        if name == queue:
            publish()  # ...and a publish right after
        return found

    monkeypatch.setattr(rabbitmq_redeclare, "_passive", then_publish)
    with contextlib.suppress(RedeclareRefused):
        redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations("quorum", 25), [queue])
    assert _drain_with_holding(amqp_url, queue) == bodies


def test_a_classic_queue_that_received_a_message_while_emptied_is_kept_and_the_refusal_says_so(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"refill-{uuid.uuid4().hex[:6]}"
    bodies = _fill_classic_queues(amqp_url, queue)
    publish = _publishing_meanwhile(amqp_url, queue, bodies)
    move = rabbitmq_redeclare._move

    def then_publish(connection: Any, source: str, target: str) -> int:
        moved = move(connection, source, target)
        if source == queue:
            publish()
        return moved

    monkeypatch.setattr(rabbitmq_redeclare, "_move", then_publish)
    refused = f"queue '{queue}' received messages or a consumer while it was being emptied .* nothing was lost"
    with pytest.raises(RedeclareRefused, match=refused):
        redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations("quorum", 25), [queue])
    assert rabbitmq_queues(amqp_url)[queue][0] == "classic"
    assert _drain_with_holding(amqp_url, queue) == bodies


def test_redeclare_interrupted_after_the_delete_finishes_the_next_time(amqp_url: str) -> None:
    """The messages wait in the holding queue; the next run declares the queue and moves them back."""
    queue = f"resume-{uuid.uuid4().hex[:6]}"
    declarations = QueueDeclarations("quorum", 25)
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue + HOLDING_SUFFIX, durable=True, arguments={"x-queue-type": "quorum"})
        for seq in range(5):
            channel.basic_publish("", queue + HOLDING_SUFFIX, b"m%d" % seq, pika.BasicProperties(delivery_mode=2))
    done = redeclare_queues([pika.URLParameters(amqp_url)], declarations, [queue])
    assert (done[0].action, done[0].moved) == (Action.CREATED, 5)
    assert rabbitmq_queues(amqp_url)[queue] == ("quorum", declarations.arguments_of(queue))
    assert _drain(amqp_url, queue) == Counter(b"m%d" % seq for seq in range(5))


def test_redeclare_refuses_queues_someone_consumes_and_changes_nothing(amqp_url: str) -> None:
    queue = f"busy-{uuid.uuid4().hex[:6]}"
    bodies = _fill_classic_queues(amqp_url, queue)
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        channel.basic_consume(f"{queue}.DQ", lambda *_: None)  # a worker's delay-queue consumer
        with pytest.raises(RedeclareRefused, match=rf"queue '{queue}.DQ' has 1 consumer\(s\): stop every worker"):
            redeclare_queues([pika.URLParameters(amqp_url)], QueueDeclarations("quorum", 25), [queue])
    on_server = rabbitmq_queues(amqp_url)
    assert {on_server[name][0] for name in (queue, f"{queue}.DQ", f"{queue}.XQ")} == {"classic"}
    assert _drain(amqp_url, queue) == bodies


def test_the_redeclare_command_names_each_queue(vhost: str, database_url: str) -> None:
    classic = broker_from_url(vhost)
    queues = sorted({spec.queue_name for spec in welcome_app.steps.values()})
    try:
        classic.enqueue(dramatiq.Message(queues[0], "x.y", (), {}, {}))
    finally:
        classic.close()
    env = service_env(database_url, vhost, ESTAFETA_RABBITMQ_QUEUE_TYPE="quorum", ESTAFETA_MAX_DELIVERIES="9")
    argv = [str(BIN / "estafeta"), "--app", "examples.welcome", "queues", "redeclare"]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"{queues[0]}: redeclared quorum, 1 message(s) kept" in lines
    assert f"{queues[0]}.XQ: redeclared quorum, 0 message(s) kept" in lines
    assert f"{queues[1]}: declared quorum" in lines  # no such queue yet
    assert rabbitmq_queues(vhost)[queues[0]][1]["x-delivery-limit"] == 9
    # On a broker that is not RabbitMQ: a usage error, one line.
    env = service_env(database_url, "redis://127.0.0.1:6379/0")
    refused = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        == "estafeta queues redeclare: ESTAFETA_BROKER_URL is not a RabbitMQ URL (redis://127.0.0.1:6379/0)"
    )


@pytest.mark.heavy
def test_an_order_system_moved_from_classic_to_quorum_queues_mid_run_loses_no_order(
    vhost: str, database_url: str, runtime, tmp_path: Path
) -> None:
    """The documented procedure, on the order system: sagas in flight on classic queues, workers
    SIGKILLed (their messages go back to the queues), the relay stopped, ``estafeta queues
    redeclare`` with ``ESTAFETA_RABBITMQ_QUEUE_TYPE=quorum``, everything restarted on quorum queues.
    """
    plan = Plan(orders=60, processes=1, threads=4, step_timeout=4.0, timeout=240, kill=False)
    run = KillAndRecover(database_url, vhost, plan, tmp_path)
    run.prepare()
    run.start()
    try:
        run.place()
        run.wait_for("a quarter of the sagas", lambda: run.ended() >= plan.orders // 4, plan.timeout)
        assert run.workers is not None
        run.workers.kill()
        # The killed workers' unacknowledged messages go back to their queues once RabbitMQ has
        # seen their connections close, and what the relay still publishes waits there too.
        # Steps that keep up may leave neither: every saga in flight then has its next message
        # in an outbox (a wake-up its killed worker never sent), which the relay's next poll
        # publishes. So the relay is stopped once messages wait, not before.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: any(rabbitmq_messages(vhost).values()), timeout=10, interval=0.2)
        run.stop()
        queued = {name: n for name, n in rabbitmq_messages(vhost).items() if n}
        assert queued, "no message waited in the classic queues: the move proves nothing"
        assert {kind for kind, _ in rabbitmq_queues(vhost).values()} == {"classic"}
        run.env["ESTAFETA_RABBITMQ_QUEUE_TYPE"] = "quorum"
        moved = run.estafeta("queues", "redeclare")
        assert {kind for kind, _ in rabbitmq_queues(vhost).values()} == {"quorum"}, moved
        after = {name: n for name, n in rabbitmq_messages(vhost).items() if n}
        assert after == queued, moved
        run.start()
        run.wait_for("every saga", lambda: run.settled() >= plan.orders, plan.timeout)
    finally:
        run.stop()
    report = run.report(0)
    print(report, queued)
    assert report["orders"] == plan.orders
    assert set(report["sagas"]) <= {"completed", "compensated"}, report["sagas"]
    assert report["reconciled"] is True, report["mismatches"]


def _processed(conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM probe.pings WHERE ping_id = ANY(%s)", pings))


def _died_or_done(workers: processes.Process, conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> bool:
    parked = inbox.list_dead_letters(conn, "probe")
    assert len(parked) <= 1, f"more than the killer parked: {[letter['consumer'] for letter in parked]}"
    return workers.popen.poll() is not None or _processed(conn, pings) == len(pings)


@pytest.mark.heavy
def test_a_message_that_kills_its_worker_is_parked_by_the_inbox_not_dead_lettered_by_rabbitmq(
    vhost: str, database_url: str, runtime, conn, tmp_path: Path
) -> None:
    """``x-delivery-limit`` = ``ESTAFETA_MAX_DELIVERIES`` end to end, with real workers SIGKILLed by a message.

    RabbitMQ delivers the killer again to each restarted worker; the inbox counts the
    deliveries and parks it at the third (``ESTAFETA_MAX_DELIVERIES=2``), with its reason,
    before RabbitMQ's limit would move it to ``probe.XQ`` where no operator looks. A slow
    message in flight beside the killer at both kills is redelivered too, runs alone, and
    is processed: neither the inbox nor RabbitMQ parks it.
    """
    env = service_env(
        database_url,
        vhost,
        ESTAFETA_APP="tests.app",
        ESTAFETA_MAX_DELIVERIES="2",
        ESTAFETA_RABBITMQ_QUEUE_TYPE="quorum",
    )
    pings = [uuid.uuid4() for _ in range(10)]
    with conn.transaction():
        # The killer works half a second first; the message after it, started beside it by
        # the second thread, is still at work then (3 s): in flight at both kills.
        probe.send(conn, Crash(uuid.uuid4(), after_s=0.5))
        probe.send(conn, Linger(pings[0], seconds=3))
        for ping in pings[1:]:
            probe.send(conn, Explode(ping, times=0))
    killed = 0
    with processes.running(processes.relay(env, tmp_path)):
        while _processed(conn, pings) < len(pings):
            assert killed <= 2, "the message was not parked after ESTAFETA_MAX_DELIVERIES"
            workers = processes.workers(env, tmp_path, module="tests.worker", threads=2)
            with processes.running(workers):
                wait_until(
                    functools.partial(_died_or_done, workers, conn, pings),
                    timeout=90,
                    what="a worker killed by its message, or every other message processed",
                )
                killed += workers.popen.poll() is not None
    assert killed == 2
    assert scalar(conn, "SELECT count(*) FROM probe.pings") == len(pings)  # each once
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert "delivered 3 times without finishing (does it kill its worker?)" in letter["reason"]
    assert rabbitmq_messages(vhost)["probe.XQ"] == 0
    assert rabbitmq_queues(vhost)["probe"][1]["x-delivery-limit"] == 2
