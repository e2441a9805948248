"""The order saga on Kafka with 12 partitions per topic and four worker processes per consumer group,
two of which are SIGKILLed mid-run and started again.

What can be tested of Kafka's partitions and consumer groups on one Tansu (memory storage, one
broker): each queue's topic has 12 partitions, four ``dramatiq estafeta_actors`` processes share every
queue's consumer group, and two of them die by SIGKILL while sagas run, so their partitions move
to the survivors with messages in flight (a rebalance), and move again when the two come back.
Afterwards: every saga completed or compensated, money and stock conserved, nobody charged twice,
every outbox drained, no dead letter, every record's offset committed by its group; and per key,
the saga's commands sit in one partition of their topic, in the order the saga sent them, and
were processed in that order.
"""

from __future__ import annotations

import collections
import os
import signal
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from estafeta.steps.context import REPLY_TO
from estafeta_actors.kill_and_recover import Child, KillAndRecover, Plan
from estafeta_brokers.kafka_config import parse_kafka_url

from ..helpers import scalar, wait_until
from ..kafka_support import Record, committed_offsets, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

PARTITIONS = 12
WORKERS = 4
ORDERS = 120
#: The queues of the order system, one topic (and one consumer group) each.
QUEUES = ("orders", "payments", "inventory", "notifications")


class FourWorkers:
    """Four ``dramatiq estafeta_actors`` processes of their own (each its own process group) and one relay."""

    def __init__(self, run: KillAndRecover, log_dir: Path) -> None:
        self.run = run
        self.log_dir = log_dir
        self.workers: list[Child] = [self._worker(i) for i in range(WORKERS)]
        self.relay = Child("relay", [str(run.bin / "estafeta"), "relay"], run.env, log_dir)

    def _worker(self, index: int) -> Child:
        argv = [str(self.run.bin / "dramatiq"), "estafeta_actors", "--processes", "1", "--threads", "4"]
        # Its database sessions carry its name, so the test sees when it is inside a step's transaction.
        env = {**self.run.env, "PGAPPNAME": self.name(index)}
        return Child(f"worker{index}", argv, env, self.log_dir)

    def name(self, index: int) -> str:
        return f"{self.run.prefix}worker{index}"

    def in_transaction(self, conn: psycopg.Connection[Any], *indexes: int) -> bool:
        """Whether one of these workers is inside a step's transaction now (its inbox or outbox write)."""
        query = """SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)
                   AND xact_start IS NOT NULL AND query ~* '\\m(inbox|outbox)\\M'"""
        return int(scalar(conn, query, [self.name(i) for i in indexes])) > 0

    def kill(self, *indexes: int) -> None:
        """SIGKILL these workers at once (then reap them)."""
        for index in indexes:
            os.killpg(self.workers[index].popen.pid, signal.SIGKILL)
        for index in indexes:
            self.workers[index].popen.wait(30)

    def restart(self, index: int) -> None:
        self.workers[index] = self._worker(index)

    def stop(self) -> None:
        for child in [*self.workers, self.relay]:
            child.stop()


def test_sagas_survive_two_of_four_workers_killed_with_12_partitions(
    kafka_url: str, database_url: str, runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    url = f"{kafka_url}&partitions={PARTITIONS}"
    run = KillAndRecover(database_url, url, Plan(orders=ORDERS, step_timeout=10.0, timeout=240), tmp_path)
    outcome = _run_killing_two_workers(run, conn, tmp_path)
    report = outcome["report"]
    records = {queue: read_topic(url, queue) for queue in QUEUES}
    print(outcome)

    # Killed with sagas in flight, and restarted while sagas still ran: two rebalances of every group mid-run.
    # (At the restart, running or compensating: on a quick day the survivors had finished every
    # saga that was going to complete while the groups rebalanced, and only compensations moved.)
    assert outcome["at_kill"].get("running", 0) > 0, outcome["at_kill"]
    in_flight_at_restart = outcome["at_restart"].get("running", 0) + outcome["at_restart"].get("compensating", 0)
    assert in_flight_at_restart > 0, outcome["at_restart"]
    # Every saga final, money and stock conserved, nobody charged twice, nothing parked.
    assert report["orders"] == ORDERS
    assert set(report["sagas"]) <= {"completed", "compensated"}, report["sagas"]
    assert sum(report["sagas"].values()) == ORDERS
    assert report["reconciled"] is True, report["mismatches"]
    assert report["money"][0] == report["money"][1] and report["stock"][0] == report["stock"][1]
    assert _dead_letters(conn) == 0
    for queue in QUEUES:
        assert read_topic(url, f"{queue}.XQ") == [], f"dead letters in {queue}.XQ"
    # The partitions setting took: 12 per topic, and the 120 orders' keys spread over all of them.
    for queue in QUEUES:
        assert _partition_count(url, queue) == PARTITIONS, queue
    assert {record.partition for record in records["payments"]} == set(range(PARTITIONS))
    _assert_per_key_order(records, conn)


def _run_killing_two_workers(run: KillAndRecover, conn: psycopg.Connection[Any], log_dir: Path) -> dict[str, Any]:
    """Place the orders on four workers, SIGKILL two mid-step, restart them once the others made
    progress alone, and wait for every saga, every outbox and every group's offsets."""
    plan = run.plan
    topics = [parse_kafka_url(run.env["ESTAFETA_BROKER_URL"]).topic(queue) for queue in QUEUES]
    run.estafeta(
        "seed", "--prefix", run.prefix, "--customers", str(plan.customers), "--balance", str(plan.balance()),
        "--skus", str(plan.skus), "--stock", str(plan.stock()),
    )  # fmt: skip
    started = time.monotonic()
    fleet = FourWorkers(run, log_dir)
    try:
        place = ["orders", "place", "--quantity", "1", "--amount", str(plan.amount), "--count", str(plan.orders)]
        place += [a for i in range(1, plan.customers + 1) for a in ("--customer", f"{run.prefix}c{i}")]
        place += [a for i in range(1, plan.skus + 1) for a in ("--sku", f"{run.prefix}sku{i}")]
        run.estafeta(*place)
        run.wait_for("a quarter of the sagas", lambda: run.ended() >= plan.orders // 4, plan.timeout)
        # SIGKILL two workers while sagas run and one of the two is inside a step (a message in flight).
        wait_until(partial(fleet.in_transaction, conn, 0, 1), timeout=60, interval=0.002, what="a step in worker 0/1")
        fleet.kill(0, 1)
        at_kill, ended_at_kill = run.counts(), run.ended()
        seen = [len(fleet.workers[i].log.read_bytes()) for i in (2, 3)]

        def rebalanced() -> bool:  # every group gave the survivors new partitions since the kill
            logs = [
                fleet.workers[i].log.read_bytes()[n:].decode(errors="replace")
                for i, n in zip((2, 3), seen, strict=True)
            ]
            return all(any(f"{topic}: assigned partitions" in log for log in logs) for topic in topics)

        # The two survivors take over all 12 partitions of every topic and make progress alone...
        wait_until(rebalanced, timeout=60, what="the survivors assigned the dead workers' partitions")
        run.wait_for("progress on two workers", lambda: run.ended() >= min(plan.orders, ended_at_kill + 10), 120)
        # ...then the two come back and the groups rebalance again, sagas still running.
        at_restart = run.counts()
        fleet.restart(0)
        fleet.restart(1)
        run.wait_for("every saga", lambda: run.settled() >= plan.orders, plan.timeout)
        wait_until(lambda: _pending_outbox_rows(conn) == 0, timeout=60, what="every outbox drained")
        wait_until(lambda: _uncommitted(run.env["ESTAFETA_BROKER_URL"]) == {}, timeout=60, what="offsets committed")
        duplicates = sum(
            child.log.read_text(errors="replace").count("duplicate delivery of") for child in fleet.workers
        )
    except BaseException:
        for child in [*fleet.workers, fleet.relay]:
            print(f"--- {child.name} ---\n{child.log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        fleet.stop()
    report = run.report(time.monotonic() - started)
    return {"report": report, "at_kill": at_kill, "at_restart": at_restart, "duplicates_absorbed": duplicates}


def _partition_count(url: str, queue: str) -> int:
    config = parse_kafka_url(url)
    admin = AdminClient(config.admin_config())
    topic = config.topic(queue)
    return len(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def _pending_outbox_rows(conn: psycopg.Connection[Any]) -> int:
    return sum(scalar(conn, f"SELECT count(*) FROM {service}.outbox") for service in QUEUES)


def _dead_letters(conn: psycopg.Connection[Any]) -> int:
    return sum(scalar(conn, f"SELECT count(*) FROM {service}.dead_letters") for service in QUEUES)


def _uncommitted(url: str) -> dict[str, dict[int, tuple[int, int | None]]]:
    """Per queue, the partitions whose group's committed offset is not past their last record."""
    behind = {}
    for queue in QUEUES:
        ends: dict[int, int] = {}
        for record in read_topic(url, queue):
            ends[record.partition] = record.offset + 1
        committed = committed_offsets(url, queue)
        lagging = {p: (end, committed.get(p)) for p, end in ends.items() if committed.get(p) != end}
        if lagging:
            behind[queue] = lagging
    return behind


def _saga_position(record: Record) -> tuple[str, tuple[int, int]] | None:
    """A saga command's saga id and its place in the saga: (version, send attempt); ``None`` for a reply.

    The attempt is not in the message, but its id is ``uuid5(saga_id, "version:direction:step:attempt")``.
    """
    message = record.message()
    reply_to = message.options.get(REPLY_TO)
    if not reply_to:
        return None
    context = reply_to["context"]
    saga_id = uuid.UUID(context["saga_id"])
    prefix = f"{context['version']}:{context['direction']}:{context['step']}"
    for attempt in range(100):
        if str(uuid.uuid5(saga_id, f"{prefix}:{attempt}")) == message.message_id:
            return str(saga_id), (int(context["version"]), attempt)
    raise AssertionError(f"message {message.message_id} is no send of saga {saga_id}")


def _assert_per_key_order(records: dict[str, list[Record]], conn: psycopg.Connection[Any]) -> None:
    """Per key: one partition per topic; the saga's commands in send order there, and processed in that order.

    Only the saga's commands are compared: they all come from the orders service's outbox, whose
    relay keeps a key's commit order. Replies reach the orders topic from four outboxes, with no
    order between them. A copy (the same message again) may come later; the first of each may not.
    A watchdog's re-send (attempt 2 onwards) races with the saga by design, so the processing order
    is compared over each step's first send (the saga's own line).
    """
    sends: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}  # (queue, key) -> message id -> place
    for queue, topic_records in records.items():
        by_key: dict[bytes, list[Record]] = collections.defaultdict(list)
        for record in topic_records:
            if record.key is not None:  # a Dramatiq retry comes back from the delay topic without its key
                by_key[record.key].append(record)
        for key, key_records in by_key.items():
            partitions = {record.partition for record in key_records}
            assert len(partitions) == 1, f"key {key!r} in partitions {sorted(partitions)} of {queue}"
            firsts: dict[str, tuple[int, int]] = {}
            for record in key_records:  # in offset order
                position = _saga_position(record)
                if position is not None:
                    firsts.setdefault(record.message().message_id, position[1])
            places = list(firsts.values())
            assert places == sorted(places), f"key {key!r} out of order in {queue}: {places}"
            if firsts:
                sends[queue, key.decode()] = firsts
    assert sum(map(len, sends.values())) >= ORDERS * 3  # at least three commands per order: all seen
    processed = _processed_at(conn, [m for firsts in sends.values() for m in firsts])
    missing = [m for firsts in sends.values() for m in firsts if m not in processed]
    assert missing == [], f"{len(missing)} commands in the topics never processed"
    for (queue, key), firsts in sends.items():
        first_attempt = {version: min(a for v, a in firsts.values() if v == version) for version, _ in firsts.values()}
        line = {m: (version, a) for m, (version, a) in firsts.items() if a == first_attempt[version]}
        by_time = [line[m] for m in sorted(line, key=processed.__getitem__)]
        assert by_time == sorted(by_time), f"key {key} processed out of order in {queue}: {by_time}"


def _processed_at(conn: psycopg.Connection[Any], message_ids: list[str]) -> dict[str, Any]:
    """When each message was first processed (its inbox row, in whichever service)."""
    first: dict[str, Any] = {}
    for service in QUEUES:
        query = f"SELECT message_id::text, processed_at FROM {service}.inbox WHERE message_id = ANY(%s::uuid[])"
        for message_id, at in conn.execute(query, (message_ids,)).fetchall():
            first[message_id] = min(at, first.get(message_id, at))
    return first
