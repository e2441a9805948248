"""What a "confirmed" publish means on Redis: a warning when nothing persists, WAIT for replicas on request."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from estafeta_brokers import broker_from_url
from estafeta_brokers.publish import publisher_for

from ..helpers import scalar, wait_until
from ..redis_servers import free_port
from ..relay_support import add
from ..services import require
from . import processes
from .relay_faults import read_queue
from .test_relay_publishers import row

pytestmark = pytest.mark.integration

WARNING = "persists nothing"


@contextmanager
def redis_server(directory: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A private ``redis-server`` with ``args``: its URL and its process (killed afterwards)."""
    binary = shutil.which("redis-server")
    require("redis-server", binary is not None, "redis-server is not on PATH")
    assert binary is not None
    port = free_port()
    log = (directory / f"redis-{port}.log").open("ab")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        wait_until(lambda: _answers(client), timeout=10, what=f"redis-server on {port}")
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        client.close()
        process.kill()
        process.wait(10)
        log.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def in_sync(client: redis.Redis) -> bool:
    return bool(client.info("replication").get("slave0", {}).get("state") == "online")


def test_the_relay_warns_once_when_its_redis_persists_nothing(database_url, redis_url, runtime, conn, tmp_path):
    # The shared test Redis runs with --save "" --appendonly no.
    env = processes.service_env(database_url, redis_url)
    relay = processes.relay(env, tmp_path, "--lanes", "2")
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    with processes.running(relay):
        add(conn, "k", 0, queue=queue)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=30)
        wait_until(lambda: WARNING in relay.output(), timeout=10, what="the warning")
        time.sleep(0.5)
        assert relay.output().count(WARNING) == 1  # once per process, not per lane or batch
    assert len(read_queue(redis_url, queue)) == 1


def test_no_warning_when_redis_keeps_an_append_only_file(database_url, runtime, conn, tmp_path) -> None:
    with redis_server(tmp_path, "--appendonly", "yes", "--save", "") as (url, _):
        env = processes.service_env(database_url, url)
        relay = processes.relay(env, tmp_path)
        with processes.running(relay):
            add(conn, "k", 0)
            wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=30)
            time.sleep(0.5)
            assert WARNING not in relay.output()


def test_wait_confirms_a_batch_only_once_replicas_have_it(tmp_path: Path) -> None:
    # No diskless-sync delay: the replica is in sync in a moment, not 5 s.
    with redis_server(tmp_path, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0") as (primary, _):
        port = primary.rsplit(":", 1)[1].split("/")[0]
        replica_args = ("--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", port)
        with redis_server(tmp_path, *replica_args) as (_, replica):
            client = redis.Redis.from_url(primary)
            wait_until(lambda: in_sync(client), timeout=30, what="the replica in sync")
            broker = broker_from_url(primary + "?wait=1")
            # Time enough for the replica's acknowledgement on a busy machine...
            patient = publisher_for(broker, confirm_timeout=15, wait_replicas=1)
            assert patient.publish([row(1)]).confirmed == [1]
            patient.close()
            # ...and a short wait where no replica will ever acknowledge.
            publisher = publisher_for(broker, confirm_timeout=1, wait_replicas=1)
            replica.kill()
            replica.wait(10)
            wait_until(lambda: client.info("replication")["connected_slaves"] == 0, timeout=20, what="no replica")
            outcome = publisher.publish([row(2)])
            # In the primary's memory only: not confirmed, not the row's fault; it is published again later.
            assert outcome.confirmed == [] and outcome.failed == {}
            assert "0 of 1 replica" in (outcome.broker_error or "")
            publisher.close()
            broker.close()
            client.close()


def test_a_wait_option_is_checked_like_the_rest_of_the_url() -> None:
    with pytest.raises(ValueError, match="wait"):
        broker_from_url("redis://127.0.0.1:6379/0?wait=some")
    with pytest.raises(ValueError, match="wait"):
        broker_from_url("amqp://guest:guest@127.0.0.1:5672/?wait=1")
