"""The relay against real brokers that misbehave: a Redis that never answers, returned messages, poison rows."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pika
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from psycopg.types.json import Jsonb

from estafeta_brokers import broker_from_url
from estafeta_brokers.publish import publisher_for

from ..helpers import scalar, wait_until
from ..relay_support import add
from . import processes
from .relay_faults import blackhole, consume_all, with_port
from .test_relay_publishers import row

pytestmark = pytest.mark.integration


@pytest.mark.heavy
def test_a_redis_that_accepts_and_never_answers_does_not_hang_the_relay(
    database_url, redis_url, runtime, conn, tmp_path
):
    add(conn, "k", 0)
    with blackhole() as port:
        env = processes.service_env(database_url, with_port(redis_url, port))
        relay = processes.relay(env, tmp_path, "--confirm-timeout", "1")
        with processes.running(relay):
            # Its first batch asks Redis for the Lua stack size (Dramatiq's maxstack script):
            # a call without a timeout would wait forever. It pauses, then tries again.
            wait_until(lambda: relay.output().count("relay paused") >= 2, timeout=30, what="two pauses")
            assert relay.popen.poll() is None
            assert "Timeout" in relay.output()
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE attempts = 0") == 1  # not the row's fault


def test_the_first_batch_to_a_silent_redis_times_out_even_when_the_brokers_client_never_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # redis-py before 8 gives a client no socket timeout at all, and Dramatiq runs its
    # maxstack script once per process, on the broker's own client, before the first enqueue.
    monkeypatch.setattr(RedisBroker, "_max_unpack_size_val", None)  # a fresh process
    with blackhole() as port:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=None, socket_connect_timeout=None)
        publisher = publisher_for(RedisBroker(client=client), confirm_timeout=1)
        outcomes: list[Any] = []
        thread = threading.Thread(target=lambda: outcomes.append(publisher.publish([row(1)])), daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), "the publish hangs on a Redis that never answers"
        client.close()
        publisher.close()
    (outcome,) = outcomes
    assert outcome.confirmed == [] and outcome.failed == {}
    assert "Timeout" in (outcome.broker_error or "")


def poison(conn: Any, key: str) -> None:
    """A row whose message is not an object (written by hand, or by a bug): it cannot be encoded."""
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " VALUES (gen_random_uuid(), 'relaycheck', 'relaycheck.record', %s, %s)",
        (Jsonb(["not", "an object"]), key),
    )


# Each broker; the Redis run is long: make test-heavy.
@pytest.fixture(params=["rabbitmq", pytest.param("redis", marks=pytest.mark.heavy)])
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("amqp_url" if request.param == "rabbitmq" else "redis_url"))


@pytest.mark.heavy
def test_a_row_that_cannot_be_encoded_fails_alone_and_the_relay_carries_on(
    broker_url, database_url, runtime, conn, tmp_path: Path
) -> None:
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    poison(conn, "k")
    add(conn, "k", 1, queue=queue)  # behind the poison row: waits, to keep the key's order
    add(conn, "other", 0, queue=queue)
    env = processes.service_env(database_url, broker_url, ESTAFETA_RELAY_MAX_ATTEMPTS="2")
    relay = processes.relay(env, tmp_path)
    with processes.running(relay):
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE status = 'failed'") == 1)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 2)  # "other" went out
        assert relay.popen.poll() is None
    error = scalar(conn, "SELECT last_error FROM pingpong.outbox WHERE status = 'failed'")
    assert "cannot be encoded" in error
    broker = broker_from_url(broker_url)
    broker.declare_queue(queue)
    try:
        assert [m.args[0]["key"] for m in consume_all(broker, queue)] == ["other"]
    finally:
        broker.close()


class UnreadableEncoder(dramatiq.JSONEncoder):
    """Writes Dramatiq's JSON, cannot read it back (as an encoder whose key only consumers hold)."""

    def decode(self, data: bytes) -> dict[str, Any]:
        raise ValueError("this process holds no key to read messages")


@pytest.fixture
def unreadable_encoder() -> Iterator[None]:
    previous = dramatiq.get_encoder()
    dramatiq.set_encoder(UnreadableEncoder())
    yield
    dramatiq.set_encoder(previous)


def test_a_message_rabbitmq_returns_is_matched_by_its_id_never_by_its_body(amqp_url: str, unreadable_encoder) -> None:
    broker = broker_from_url(amqp_url)
    publisher = publisher_for(broker)
    try:
        assert publisher.publish([row(1)]).confirmed == [1]
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            conn.channel().queue_delete("relaycheck")  # behind the relay's back: the next publish comes back
        returned = publisher.publish([row(2), row(3, queue="relaycheck_other")])
        # The returned row is neither confirmed nor blamed; the other one went out.
        assert returned.confirmed == [3] and returned.failed == {} and returned.broker_error is None
    finally:
        publisher.close()
        for queue in ("relaycheck", "relaycheck_other"):
            broker.declare_queue(queue)
            broker.flush(queue)
        broker.close()
