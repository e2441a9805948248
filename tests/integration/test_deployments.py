"""Two deployments of the order system on one RabbitMQ vhost, and on one Redis namespace.

Each deployment has its own database (so its own name, ``estafeta.app.deployment``), its
own ``dramatiq estafeta_actors`` workers and ``estafeta relay``. While both consume the shared queues,
each one's workers take a share of the other's messages: they park them as dead letters
naming both deployments, never run them. Then one deployment runs alone, and the other: the
sagas whose messages the other parked are re-sent by their watchdog. Every saga of each ends
completed or compensated in its own database, each reconciles, and no business row of one
deployment is about an order of the other. ``estafeta queues`` shows the consumers, and
``estafeta demo`` refuses to start on queues another deployment consumes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from estafeta import Runtime
from estafeta.app.deployment import deployment_name
from estafeta_actors.kill_and_recover import KillAndRecover, Plan
from estafeta_brokers import broker_from_url
from estafeta_brokers.queue_consumers import queue_consumers

from ..services import RUN_ID, rabbitmq_vhost, require_redis, scratch_database
from .order_runs import wait_until
from .processes import estafeta, running, service_env, workers

pytestmark = [pytest.mark.integration]

ORDERS = 30
#: Long enough that a saga spends at most one or two of its three sends while both deployments
#: consume, short enough that the sends the other deployment parked are re-sent soon.
STEP_TIMEOUT = 15.0


@contextmanager
def shared_broker(kind: str) -> Iterator[str]:
    """A broker URL for this test alone: a RabbitMQ vhost, or a Redis namespace."""
    name = f"{RUN_ID}-deployments-{uuid.uuid4().hex[:6]}"
    if kind == "rabbitmq":
        with rabbitmq_vhost(name) as url:
            yield url
        return
    url = require_redis()
    yield f"{url}{'&' if '?' in url else '?'}namespace={name}"
    import redis

    client = redis.Redis.from_url(url.split("?", 1)[0])
    for key in client.scan_iter(f"{name}*", count=1000):
        client.delete(key)
    client.close()


def _consumers(url: str, queue: str = "orders") -> int:
    broker = broker_from_url(url)
    try:
        return queue_consumers(broker, queue).count or 0
    finally:
        broker.close()


def _refusals(dsn: str, theirs: str, ours: str) -> int:
    """Dead letters of every service of ``dsn`` refusing a message of deployment ``theirs``, by ``ours``."""
    said = f"message of deployment {theirs} refused by deployment {ours}: "
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sum(
            int(
                conn.execute(f"SELECT count(*) FROM {s}.dead_letters WHERE strpos(reason, %s) > 0", (said,)).fetchone()[
                    0
                ]
            )  # type: ignore[index]
            for s in ("orders", "payments", "inventory", "notifications")
        )


def _rows_of_other_orders(dsn: str) -> dict[str, int]:
    """Business rows in ``dsn`` about an order that is not one of its own."""
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("payments.payments", "inventory.reservations", "notifications.sent", "orders.saga_order"):
            row = conn.execute(
                f"SELECT count(*) FROM {table} t WHERE NOT EXISTS"
                " (SELECT FROM orders.orders o WHERE o.order_id = t.order_id)"
            ).fetchone()
            found[table] = int(row[0]) if row else 0
    return found


def _name(run: KillAndRecover) -> str:
    runtime = Runtime(run.settings)
    try:
        return deployment_name(runtime)
    finally:
        runtime.close()


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["rabbitmq", "redis"])
def test_two_deployments_on_one_broker_namespace_never_act_on_each_other_s_messages(kind: str, tmp_path: Path) -> None:
    plan = Plan(orders=ORDERS, processes=1, threads=4, step_timeout=STEP_TIMEOUT, timeout=600, kill=False)
    with shared_broker(kind) as url, scratch_database() as dsn_a, scratch_database() as dsn_b:
        a, b = KillAndRecover(dsn_a, url, plan, tmp_path), KillAndRecover(dsn_b, url, plan, tmp_path)
        a.prepare()
        b.prepare()
        name_a, name_b = _name(a), _name(b)
        assert name_a != name_b
        a_logs, b_logs = [], []
        try:
            a.start()
            b.start()
            a_logs.append(a.workers.log)  # type: ignore[union-attr]
            b_logs.append(b.workers.log)  # type: ignore[union-attr]
            wait_until("both deployments' workers on the queues", lambda: _consumers(url) >= 2, 120)
            a.place()
            b.place()
            wait_until(
                "each deployment to refuse a message of the other",
                lambda: _refusals(dsn_a, name_b, name_a) and _refusals(dsn_b, name_a, name_b),
                120,
            )
            b.stop()  # A alone: its sagas whose messages B parked are re-sent, and reach A
            a.wait_for("every saga of A", lambda: a.settled() >= ORDERS, plan.timeout)
            a.stop()
            b.start()  # then B alone
            b_logs.append(b.workers.log)  # type: ignore[union-attr]
            b.wait_for("every saga of B", lambda: b.settled() >= ORDERS, plan.timeout)
        finally:
            a.stop()
            b.stop()
        for run, dsn in ((a, dsn_a), (b, dsn_b)):
            report = run.report(0)
            assert report["reconciled"], report
            assert set(report["sagas"]) <= {"completed", "compensated"}, report
            assert sum(report["sagas"].values()) == ORDERS
            assert _rows_of_other_orders(dsn) == dict.fromkeys(_rows_of_other_orders(dsn), 0)
        # Each worker process said once that it refuses the other deployment's messages.
        said_a = [p.read_text().count(f"messages of deployment {name_b} reach deployment {name_a}") for p in a_logs]
        said_b = [p.read_text().count(f"messages of deployment {name_a} reach deployment {name_b}") for p in b_logs]
        assert said_a == [1] and said_b[0] == 1 and said_b[1] <= 1, (said_a, said_b)


@pytest.mark.parametrize("kind", ["rabbitmq", "redis"])
def test_the_demo_refuses_to_start_on_queues_another_deployment_consumes(kind: str, tmp_path: Path) -> None:
    with shared_broker(kind) as url, scratch_database() as dsn_a, scratch_database() as dsn_b:
        env_a, env_b = service_env(dsn_a, url), service_env(dsn_b, url)
        assert estafeta(env_a, "migrate").returncode == 0
        with running(workers(env_a, tmp_path)):
            wait_until("the other deployment's workers on the queues", lambda: _consumers(url) >= 1, 120)
            listed = estafeta(env_b, "queues", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            queues = {q["queue"]: q for q in json.loads(listed.stdout)["queues"]}
            assert queues["orders"]["consumers"] >= 1
            assert queues["orders"]["counted"] == ("queue" if kind == "rabbitmq" else "namespace")
            demo = estafeta(env_b, "demo", "--orders", "5", "--timeout", "60")
        assert demo.returncode == 2, demo.stdout + demo.stderr
        line = demo.stderr.strip()
        assert "\n" not in line and "already has consumers" in line and "inventory" in line, line
        with psycopg.connect(dsn_b, autocommit=True) as conn:  # nothing placed, not even migrated
            assert conn.execute("SELECT to_regclass('orders.orders')").fetchone() == (None,)
