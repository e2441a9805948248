"""The order saga with real `dramatiq estafeta_actors` workers and a real relay, killed with SIGKILL.

Orders are placed with `estafeta orders place --count`; the workers and the relay are
killed while sagas run, the workers again while sagas compensate, and everything is
restarted. Every saga must end completed or compensated, nobody charged twice, money
and stock conserved, and the payments ledger replayed from its events equal to the
payments.accounts projection (actors/kill_and_recover.py is the same run at full size).
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import psycopg
import pytest

from estafeta_actors.kill_and_recover import KillAndRecover, Plan

from ..helpers import scalar
from ..services import scratch_database

pytestmark = pytest.mark.integration


# The relay and the workers on each broker; the Redis and Kafka runs are long: make test-heavy.
@pytest.fixture(
    params=["rabbitmq", pytest.param("redis", marks=pytest.mark.heavy), pytest.param("kafka", marks=pytest.mark.heavy)]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    if request.param == "rabbitmq":
        return str(request.getfixturevalue("amqp_url"))
    if request.param == "kafka":  # topics of this test's own
        return str(request.getfixturevalue("kafka_url"))
    # A namespace of this test's own: no queue left over from another test reaches these workers.
    return str(request.getfixturevalue("redis_url")) + f"-{uuid.uuid4().hex[:6]}"


def _run(database_url: str, broker_url: str, tmp_path: Path, plan: Plan) -> dict[str, object]:
    report = KillAndRecover(database_url, broker_url, plan, tmp_path).run()
    print(report)
    return report


def test_every_saga_ends_after_workers_and_relay_are_killed(
    broker_url: str, database_url: str, runtime, tmp_path: Path
) -> None:
    plan = Plan(orders=150, processes=1, threads=4, step_timeout=4.0, timeout=240)
    report = _run(database_url, broker_url, tmp_path, plan)
    first, second = report["kills"]  # type: ignore[misc]
    assert first["running"] > 0 and first["relay_killed"]  # killed with sagas in flight
    assert second["compensating"] > 0  # and again while sagas compensated
    assert report["orders"] == 150
    sagas = report["sagas"]
    assert set(sagas) == {"completed", "compensated"}, sagas  # type: ignore[arg-type]
    assert report["mismatches"] == []
    money, stock = report["money"], report["stock"]
    assert money[0] == money[1] and stock[0] == stock[1]  # type: ignore[index]
    _assert_the_ledger_agrees(report)
    assert report["reconciled"] is True


def test_every_saga_ends_after_kills_with_steps_handing_off(
    amqp_url: str, database_url: str, runtime, tmp_path: Path
) -> None:
    # ESTAFETA_HANDOFFS: most step messages go from step to step in a worker thread, their
    # rows deleted by the next step's transaction; a kill between the two leaves the row to
    # the (restarted) relay. The same checks as above.
    plan = Plan(orders=150, processes=1, threads=4, step_timeout=4.0, timeout=240)
    report = KillAndRecover(database_url, amqp_url, plan, tmp_path, extra_env={"ESTAFETA_HANDOFFS": "8"}).run()
    print(report)
    first, second = report["kills"]  # type: ignore[misc]
    assert first["running"] + first.get("compensating", 0) > 0 and first["relay_killed"]
    assert second["compensating"] > 0
    assert report["orders"] == 150
    assert set(report["sagas"]) == {"completed", "compensated"}, report["sagas"]  # type: ignore[arg-type]
    assert report["mismatches"] == []
    money, stock = report["money"], report["stock"]
    assert money[0] == money[1] and stock[0] == stock[1]  # type: ignore[index]
    _assert_the_ledger_agrees(report)
    assert report["reconciled"] is True


def _assert_the_ledger_agrees(report: dict[str, object]) -> None:
    """Money conserved in the ledger's events too, and each account's replay equal to its projection."""
    money, ledger = report["money"], report["ledger"]
    assert ledger == [money[0], money[0]], (ledger, money)  # type: ignore[index]
    # At least an opening per account and a withdrawal per completed order were replayed.
    assert report["ledger_events"] > report["sagas"]["completed"], report  # type: ignore[index, operator]
    assert report["projection_mismatches"] == [], report["projection_mismatches"]


@pytest.mark.heavy
def test_every_saga_ends_with_each_service_in_its_own_database(
    amqp_url: str, database_url: str, runtime, conn, tmp_path: Path
) -> None:
    # ESTAFETA_<SERVICE>_DATABASE_URL for the four order services: four databases, on RabbitMQ.
    services = ("orders", "payments", "inventory", "notifications")
    with contextlib.ExitStack() as stack:
        urls = {service: stack.enter_context(scratch_database()) for service in services}
        extra = {f"ESTAFETA_{service.upper()}_DATABASE_URL": url for service, url in urls.items()}
        plan = Plan(orders=150, processes=1, threads=4, step_timeout=4.0, timeout=240)
        report = KillAndRecover(database_url, amqp_url, plan, tmp_path, extra_env=extra).run()
        print(report)
        first, second = report["kills"]
        assert first["running"] > 0 and first["relay_killed"] and second["compensating"] > 0
        assert report["orders"] == 150
        assert set(report["sagas"]) == {"completed", "compensated"}, report["sagas"]
        assert report["reconciled"] is True, report["mismatches"]
        _assert_the_ledger_agrees(report)
        # Each service's rows are in its own database, and nowhere else.
        prefix = report["prefix"]
        where = {
            "orders": "SELECT count(*) FROM orders.orders WHERE starts_with(customer_id, %s)",
            "payments": "SELECT count(*) FROM payments.payments WHERE starts_with(customer_id, %s)",
            "inventory": "SELECT count(*) FROM inventory.reservations WHERE starts_with(sku, %s)",
            "notifications": "SELECT count(*) FROM notifications.sent WHERE starts_with(customer_id, %s)",
        }
        for service, query in where.items():
            with psycopg.connect(urls[service]) as own:
                assert scalar(own, query, prefix) > 0, service
            assert scalar(conn, query, prefix) == 0, service
            for other in set(services) - {service}:
                with psycopg.connect(urls[other]) as elsewhere:
                    has_table = scalar(elsewhere, "SELECT to_regclass(%s) IS NOT NULL", query.split()[3])
                    assert not has_table, f"{service}'s tables in {other}'s database"


#: Orders of the thousand-order run per broker. What it proves (volume, two worker processes sharing
#: the queues, both kills) does not depend on the broker, which the 150-order runs above already cover
#: on each: the full thousand runs once, on RabbitMQ, and a lighter run keeps the same shape and
#: checks on Redis and Kafka (two processes competing for their queues and partitions).
ORDERS_PER_BROKER = {"rabbitmq": 1000, "redis": 300, "kafka": 300}


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_done_means_a_thousand_orders_on_two_worker_processes_survive_kills(
    broker_url: str, database_url: str, runtime, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The full run: `dramatiq estafeta_actors --processes 2` and `estafeta relay`,
    `estafeta orders place --count 1000`, workers and relay killed and restarted mid-way.

    A thousand orders on RabbitMQ; 300 on Redis and Kafka (see ``ORDERS_PER_BROKER``).
    """
    orders = ORDERS_PER_BROKER[request.node.callspec.params["broker_url"]]
    plan = Plan(orders=orders, processes=2, threads=8, step_timeout=10.0, timeout=600)
    report = _run(database_url, broker_url, tmp_path, plan)
    assert len(report["kills"]) == 2  # type: ignore[arg-type]
    assert report["orders"] == orders
    assert set(report["sagas"]) == {"completed", "compensated"}, report["sagas"]  # type: ignore[arg-type]
    assert report["reconciled"] is True, report["mismatches"]
    _assert_the_ledger_agrees(report)
