"""A deployment never runs another deployment's messages: relays name theirs, workers park the others'."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Settings, build_relay
from estafeta.app.deployment import deployment_name
from estafeta.app.errors import SettingsError
from estafeta_brokers.batches import encode
from estafeta_brokers.deployments import DEPLOYMENT_OPTION
from estafeta_brokers.publish import to_message
from estafeta_sql import outbox as store
from estafeta_sql import scratch

from .helpers import message_for, scalar
from .lock_steps import open_account
from .services import admin_dsn
from .steps import Settle

SETTLE = "probe.test_settle"


def _settle_on(broker: StubBroker, order_id: uuid.UUID, **options: Any) -> dramatiq.Message[Any]:
    return broker.enqueue(message_for(SETTLE, Settle(order_id), **options))


def _charged(conn: psycopg.Connection[Any], order_id: uuid.UUID) -> int:
    return int(scalar(conn, "SELECT count(*) FROM probe.test_charges WHERE order_id = %s", order_id))


def _reasons(conn: psycopg.Connection[Any], message_ids: list[str]) -> list[str]:
    rows = conn.execute(
        "SELECT reason FROM probe.dead_letters WHERE message_id = ANY(%s) ORDER BY id", (message_ids,)
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_message_of_another_deployment_is_parked_with_both_names_and_logged_once(
    runtime: Runtime, stub_broker: StubBroker, stub_worker: dramatiq.Worker, conn, caplog: pytest.LogCaptureFixture
) -> None:
    ours = deployment_name(runtime)
    orders = [uuid.uuid4() for _ in range(4)]
    for order_id in orders:
        open_account(conn, order_id)
    with caplog.at_level(logging.INFO):
        foreign = [_settle_on(stub_broker, o, **{DEPLOYMENT_OPTION: "staging~0badcafe"}) for o in orders[:3]]
        unnamed = _settle_on(stub_broker, orders[3])  # actor.send, or a relay of an earlier version
        stub_broker.join("probe", timeout=10_000)
    assert [_charged(conn, o) for o in orders] == [0, 0, 0, 1]
    reasons = _reasons(conn, [m.message_id for m in foreign])
    assert len(reasons) == 3
    assert all(
        r.startswith(f"{SETTLE}: message of deployment staging~0badcafe refused by deployment {ours}: ")
        for r in reasons
    )
    assert not _reasons(conn, [unnamed.message_id])
    said = [r for r in caplog.records if "staging~0badcafe" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    assert "each is parked as a dead letter, never run" in said[0].getMessage()
    # A redelivery of a refused message is absorbed by the inbox: parked once.
    stub_broker.enqueue(foreign[0])
    stub_broker.join("probe", timeout=10_000)
    assert len(_reasons(conn, [foreign[0].message_id])) == 1


def test_a_message_of_this_deployment_runs(runtime: Runtime, stub_broker: StubBroker, stub_worker, conn) -> None:
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    _settle_on(stub_broker, order_id, **{DEPLOYMENT_OPTION: deployment_name(runtime)})
    stub_broker.join("probe", timeout=10_000)
    assert _charged(conn, order_id) == 1


def test_the_relay_names_its_deployment_in_every_message_it_publishes(runtime: Runtime, conn) -> None:
    broker = StubBroker()
    broker.declare_queue("probe")
    relay = build_relay(runtime, broker, ["probe"], poll_interval=0.05)
    try:
        with runtime.database("probe").transaction() as tx:
            for options in ({}, {DEPLOYMENT_OPTION: "replayed~12345678"}):
                message = store.OutgoingMessage(uuid.uuid4(), "probe", SETTLE, args=[{}], options=options)
                store.insert(tx, "probe", message)
        assert relay.drain_once() == 2
    finally:
        relay.publisher.close()
    sent = [dramatiq.Message.decode(data) for data in broker.queues["probe"].queue]
    # A row that names a deployment already (a dead letter replayed) keeps it.
    assert [m.options[DEPLOYMENT_OPTION] for m in sent] == [deployment_name(runtime), "replayed~12345678"]


def test_the_batched_publishers_encode_the_stamped_options_as_enqueue_does(runtime: Runtime) -> None:
    row = store.OutboxRow(1, uuid.uuid4(), "probe", SETTLE, {"args": [{}], "options": {}}, None, None, _now(), 0)
    from estafeta_brokers.deployments import stamp

    stamp([row], lambda: "shop~1234abcd")
    assert encode(row) == to_message(row).encode()
    assert to_message(row).options == {DEPLOYMENT_OPTION: "shop~1234abcd"}


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_a_deployment_is_its_databases_whatever_address_reaches_them(database_url: str) -> None:
    parts = psycopg.conninfo.conninfo_to_dict(database_url)
    other_spelling = psycopg.conninfo.make_conninfo(database_url, host="localhost", application_name="x")
    one = Runtime(Settings(database_url=database_url))
    two = Runtime(Settings(database_url=other_spelling))
    assert deployment_name(one) == deployment_name(two)
    assert deployment_name(one).startswith(f"{parts['dbname']}~")
    with scratch.scratch_database(admin_dsn()) as elsewhere:
        assert deployment_name(Runtime(Settings(database_url=elsewhere))) != deployment_name(one)
        # A service in a database of its own is part of what the deployment is.
        split = Runtime(Settings(database_url=database_url, service_database_urls={"payments": elsewhere}))
        assert deployment_name(split) not in (deployment_name(one), deployment_name(Runtime(Settings(elsewhere))))
    named = Runtime(Settings(database_url=database_url, deployment="production"))
    assert deployment_name(named) == "production"


@pytest.mark.parametrize("value", ["", "two words", "x" * 101, "-leading"])
def test_a_bad_deployment_name_is_one_line_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="ESTAFETA_DEPLOYMENT") as raised:
        Settings.from_env({"ESTAFETA_DEPLOYMENT": value})
    assert "\n" not in str(raised.value)


def test_the_deployment_setting_is_read_from_the_environment() -> None:
    assert Settings.from_env({"ESTAFETA_DEPLOYMENT": " staging "}).deployment == "staging"
