"""The order system on a three-node RabbitMQ cluster with quorum queues, through a node loss.

Three private nodes (tests/rabbit_servers.py) clustered with ``join_cluster``; the broker
URL names all three (``amqp://guest:guest@h1,h2,h3/%2F``), so the workers and the relay
connect to the first that answers and fail over when it goes. Mid-run, the node leading
the ``orders`` queue (every saga's commands and replies pass through it: the busiest) is
SIGKILLed, and restarted once the sagas made progress without it; then another node's
app is stopped for 10 s. No order may be lost, nobody charged twice, every saga final,
money and stock conserved, the outboxes drained. And what the same loss costs on
classic queues.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import dramatiq
import pika
import pika.exceptions
import psycopg
import pytest

from estafeta_actors.kill_and_recover import KillAndRecover, Plan
from estafeta_brokers import broker_from_url

from ..rabbit_servers import RabbitNode, rabbitmq_cluster

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

SERVICES = ("orders", "payments", "inventory", "notifications")


def _leader(nodes: list[RabbitNode], queue: str) -> RabbitNode | None:
    """The node leading quorum queue ``queue`` (``None`` before it is declared)."""
    listed = json.loads(nodes[0].ctl("list_queues", "name", "type", "leader", "--formatter", "json") or "[]")
    found = {q["name"]: q for q in listed}
    if queue not in found:
        return None
    assert found[queue]["type"] == "quorum", found[queue]
    return next(node for node in nodes if node.node == found[queue]["leader"])


def _outbox_rows(run: KillAndRecover) -> int:
    total = 0
    for service in SERVICES:
        with psycopg.connect(run.settings.database_url_for(service), autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {service}.outbox").fetchone()  # fixed names
            total += int(row[0]) if row else 0
    return total


def _outbox_left(run: KillAndRecover) -> dict[str, list[tuple[str, int, str | None, int]]]:
    """What the outboxes still hold: by service, (status, attempts, last error, rows)."""
    left = {}
    for service in SERVICES:
        with psycopg.connect(run.settings.database_url_for(service), autocommit=True) as conn:
            rows = conn.execute(
                f"SELECT status, attempts, last_error, count(*) FROM {service}.outbox"  # fixed names
                " GROUP BY 1, 2, 3 ORDER BY 1, 2"
            ).fetchall()
        if rows:
            left[service] = [(str(s), int(a), e, int(n)) for s, a, e, n in rows]
    return left


@pytest.mark.timeout(420)
def test_order_sagas_on_quorum_queues_survive_the_leader_killed_and_another_node_stopped(
    database_url: str, runtime, tmp_path: Path
) -> None:
    # Two waves of orders, each placed while no worker runs, so that each fault lands with
    # sagas in flight: the first meets the SIGKILL, the second the stopped app.
    wave = 150
    began = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began, 1)

    with rabbitmq_cluster(3) as nodes:
        phase("cluster up")
        url = "amqp://guest:guest@" + ",".join(node.host for node in nodes) + "/%2F"
        plan = Plan(orders=wave, processes=1, threads=3, step_timeout=4.0, timeout=240, kill=False)
        run = KillAndRecover(database_url, url, plan, tmp_path, extra_env={"ESTAFETA_RABBITMQ_QUEUE_TYPE": "quorum"})
        run.prepare()
        phase("seeded")
        try:
            run.place()
            run.start()
            run.wait_for("the orders queue", lambda: _leader(nodes, "orders") is not None, 60)
            victim = _leader(nodes, "orders")
            assert victim is not None
            run.wait_for("the first sagas", lambda: run.ended() >= wave // 8, plan.timeout)
            at_kill = run.counts()
            victim.kill()
            phase("leader killed")
            # The sagas go on without it: a new leader is elected among the two left.
            run.wait_for("progress without the killed node", lambda: run.ended() >= wave * 3 // 4, plan.timeout)
            phase("three quarters ended")
            victim.start()
            victim.wait()
            phase("restarted")
            run.wait_for("the first wave", lambda: run.ended() >= wave, plan.timeout)
            assert run.workers is not None
            phase("first wave ended")
            run.workers.stop()
            run.place()
            stopped = next(node for node in nodes if node is not victim)
            stopped.ctl("stop_app")
            run.start(relay=False)
            at_stop = run.counts()
            time.sleep(10)  # the fault's length, not a wait for a condition
            stopped.ctl("start_app")
            phase("app started again")
            run.wait_for("every saga", lambda: run.settled() >= 2 * wave, plan.timeout)
            try:
                run.wait_for("the outboxes drained", lambda: _outbox_rows(run) == 0, 120)
            except TimeoutError as exc:  # say what stayed, and why: a stuck relay or failed rows
                raise TimeoutError(f"{exc}; left in the outboxes: {_outbox_left(run)}") from None
            phase("second wave ended")
        finally:
            run.stop()
        report = run.report(0)
    print(phases)
    print(report, "at the kill:", at_kill, "at the stop:", at_stop, "killed:", victim.node, "stopped:", stopped.node)
    assert sum(at_kill.values()) == wave and at_kill.get("running", 0) > 0  # killed with sagas in flight
    assert sum(at_stop.values()) == 2 * wave and at_stop.get("running", 0) > 0
    assert report["orders"] == 2 * wave
    assert set(report["sagas"]) <= {"completed", "compensated"}, report["sagas"]
    assert sum(report["sagas"].values()) == 2 * wave
    assert report["mismatches"] == [], report["mismatches"]  # charged once, reserved once, per order
    money, stock = report["money"], report["stock"]
    assert money[0] == money[1] and stock[0] == stock[1]
    assert report["reconciled"] is True


def _depth(url: str, queue: str) -> int | str:
    """Messages in ``queue`` (a passive declare), or RabbitMQ's refusal."""
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        try:
            return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return f"{exc.reply_code} {exc.reply_text}"


def test_a_lost_node_takes_its_classic_queues_messages_and_leaves_quorum_queues_whole() -> None:
    """What a node loss costs on classic queues: the same confirmed messages, on both queue types.

    A classic queue lives on the node its declaring client is connected to; a quorum queue
    on all three. With that node SIGKILLed, the classic queue is unavailable; with its disk
    lost too (its data directory deleted, the node forgotten by the cluster), the classic
    queue's confirmed messages are gone, and the quorum queue still holds every one.
    """
    count = 50
    with rabbitmq_cluster(3) as nodes:
        first = nodes[0]
        hosts = ",".join(node.host for node in nodes)
        url = f"amqp://guest:guest@{hosts}/%2F"
        for queue_type, queue in (("classic", "lossy"), ("quorum", "safe")):
            broker = broker_from_url(url, queue_type=queue_type, delivery_limit=5 if queue_type == "quorum" else None)
            try:
                for seq in range(count):  # confirmed one by one (confirm_delivery)
                    broker.enqueue(dramatiq.Message(queue, f"{queue}.record", (seq,), {}, {}))
            finally:
                broker.close()
        survivor = nodes[1].url()
        assert (_depth(first.url(), "lossy"), _depth(first.url(), "safe")) == (count, count)
        first.kill()
        assert _depth(survivor, "safe") == count
        unavailable = _depth(survivor, "lossy")
        assert isinstance(unavailable, str) and unavailable.startswith("404 NOT_FOUND"), unavailable
        # Its disk lost: the data directory deleted, the node forgotten by the cluster.
        shutil.rmtree(first.env["RABBITMQ_MNESIA_BASE"])
        nodes[1].ctl("forget_cluster_node", first.node)
        lost = _depth(survivor, "lossy")
        print("classic queue after the node's loss:", lost, "quorum queue:", _depth(survivor, "safe"))
        assert lost == 0 or str(lost).startswith("404 NOT_FOUND"), lost
        assert _depth(survivor, "safe") == count
