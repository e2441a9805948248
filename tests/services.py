"""Reaching the real PostgreSQL, RabbitMQ and Redis the tests need.

Connection details come from the libpq environment (PGHOST, PGPORT, PGUSER,
PGDATABASE), ``TEST_AMQP_URL`` and ``TEST_REDIS_URL``; the defaults are the services of
the development machines. A missing service skips the tests that need it, with the
reason, except when ``CI`` is set: then it is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
import pytest

from estafeta_sql import scratch

for _var, _default in (
    ("PGHOST", "127.0.0.1"),
    ("PGPORT", "5432"),
    ("PGUSER", "postgres"),
    ("PGDATABASE", "test"),
):
    os.environ.setdefault(_var, _default)

AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/7")

#: The fixture that gives each real broker's URL (tests run against every broker use it).
BROKER_URL_FIXTURES = {"rabbitmq": "amqp_url", "redis": "redis_url", "kafka": "kafka_url"}

#: One name per test run: its RabbitMQ vhost and Redis key namespace, so concurrent runs
#: (and the queues they fill) never see each other.
RUN_ID = f"estafeta-test-{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    """A TCP port nobody listens on right now (on 127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require(service: str, reachable: bool, reason: str) -> None:
    """Skip (or, under CI, fail) when ``service`` is not reachable."""
    if reachable:
        return
    message = f"{service} is not reachable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
    pytest.skip(message)


def _port_open(url: str, default_port: int) -> tuple[bool, str]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=2):
            return True, ""
    except OSError as exc:
        return False, f"{host}:{port}: {exc}"


def require_rabbitmq() -> str:
    """The AMQP URL of a reachable RabbitMQ."""
    ok, why = _port_open(AMQP_URL, 5672)
    require("RabbitMQ", ok, why)
    return AMQP_URL


def require_redis() -> str:
    """The URL of a reachable Redis."""
    ok, why = _port_open(REDIS_URL, 6379)
    require("Redis", ok, why)
    return REDIS_URL


@contextmanager
def rabbitmq_vhost(name: str = RUN_ID) -> Iterator[str]:
    """An AMQP URL on a vhost of this run's own (deleted afterwards), or the shared one.

    A private vhost needs ``rabbitmqctl`` on this machine; without it the run uses
    ``TEST_AMQP_URL`` as it is. ``name``: another vhost (a test that needs its own).
    """
    url = require_rabbitmq()
    ctl = shutil.which("rabbitmqctl")
    if not ctl or "TEST_AMQP_URL" in os.environ:
        yield url
        return
    user = urlsplit(url).username or "guest"
    _ctl(ctl, "add_vhost", name)
    try:
        _ctl(ctl, "set_permissions", "-p", name, user, ".*", ".*", ".*")
        parts = urlsplit(url)
        yield urlunsplit(parts._replace(path="/" + name))
    finally:
        _ctl(ctl, "delete_vhost", name)


@contextmanager
def rabbitmq_policy(url: str, pattern: str, definition: dict[str, Any]) -> Iterator[None]:
    """A policy on ``url``'s vhost for the queues matching ``pattern``, cleared afterwards.

    Needs ``rabbitmqctl`` (skips, or fails under CI, without it).
    """
    ctl, vhost = _rabbitmqctl("to set a policy"), _vhost(url)
    name = f"estafeta-test-{uuid.uuid4().hex[:8]}"
    _ctl(ctl, "set_policy", "-p", vhost, "--apply-to", "queues", name, pattern, json.dumps(definition))
    try:
        yield
    finally:
        _ctl(ctl, "clear_policy", "-p", vhost, name)


def rabbitmq_queues(url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every queue of ``url``'s vhost as the server holds it: name -> (type, arguments).

    AMQP has no way to read a queue's arguments back: this asks ``rabbitmqctl`` (skips,
    or fails under CI, without it).
    """
    return {
        queue["name"]: (queue["type"], {name: value for name, _type, value in queue["arguments"]})
        for queue in _list_queues(url, "name", "type", "arguments")
    }


def rabbitmq_messages(url: str) -> dict[str, int]:
    """The messages ready in each queue of ``url``'s vhost, now.

    A passive declare per queue: ``rabbitmqctl``'s counts of a quorum queue lag by seconds.
    """
    import pika

    names = [queue["name"] for queue in _list_queues(url, "name")]
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        return {name: int(channel.queue_declare(name, passive=True).method.message_count) for name in names}


def _rabbitmqctl(why: str) -> str:
    """The path of ``rabbitmqctl`` (skips, or fails under CI, without it)."""
    ctl = shutil.which("rabbitmqctl")
    require("rabbitmqctl", ctl is not None, f"not on PATH (needed {why})")
    assert ctl is not None
    return ctl


def _vhost(url: str) -> str:
    """The vhost an AMQP URL names."""
    return unquote(urlsplit(url).path[1:]) or "/"


def _list_queues(url: str, *columns: str) -> list[dict[str, Any]]:
    ctl, vhost = _rabbitmqctl("to read queue arguments"), _vhost(url)
    listed = subprocess.run(
        [ctl, "-q", "--formatter", "json", "list_queues", "-p", vhost, *columns],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return list(json.loads(listed.stdout or "[]"))


def _ctl(ctl: str, *args: str) -> None:
    subprocess.run([ctl, "-q", *args], check=True, capture_output=True, timeout=60)


def drop_redis_namespace() -> None:
    """Delete every key of this run's namespaces (``RUN_ID`` and the ones derived from it)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL.split("?", 1)[0])
    try:
        for key in client.scan_iter(f"{RUN_ID}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def redis_namespaced() -> str:
    """A Redis URL whose keys live under this run's namespace."""
    url = require_redis()
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}namespace={RUN_ID}"


def admin_dsn(dbname: str | None = None) -> str:
    """A DSN for the test server (from the libpq environment), for ``dbname`` or PGDATABASE."""
    return psycopg.conninfo.make_conninfo(
        host=os.environ["PGHOST"],
        port=os.environ["PGPORT"],
        user=os.environ["PGUSER"],
        dbname=dbname or os.environ["PGDATABASE"],
    )


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new, empty database for this test run, dropped afterwards; yields its DSN."""
    try:
        psycopg.connect(admin_dsn(), connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        require("PostgreSQL", False, str(exc).strip().splitlines()[0])
        raise
    with scratch.scratch_database(admin_dsn()) as dsn:
        yield dsn
