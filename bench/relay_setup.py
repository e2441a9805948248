"""What the relay benchmark runs on: a scratch database, a RabbitMQ vhost, a Redis namespace and
Kafka topics of its own, outbox rows, and ``estafeta relay`` processes.

Nothing shared is touched: the database, vhost and namespace are created for the run and
removed afterwards, so the benchmark can run beside other people's test suites (its
figures are then noisy, and it says so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg

from .common import admin_dsn, rabbitmq_vhost, redis_namespace, scratch_database
from .common import machine as common_machine
from .relay_kafka import kafka_server

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
for _var, _default in (("PGHOST", "127.0.0.1"), ("PGPORT", "5432"), ("PGUSER", "postgres"), ("PGDATABASE", "test")):
    os.environ.setdefault(_var, _default)

#: The outbox the benchmark fills (the ping service's, present in every deployment).
SCHEMA = "pingpong"

_FILL = """
INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)
SELECT gen_random_uuid(), %(queue)s, %(queue)s || '.record',
       jsonb_build_object(
           'args', jsonb_build_array(jsonb_build_object(
               'order_id', gen_random_uuid()::text, 'amount_cents', i, 'sent_at', now()::text)),
           'kwargs', '{}'::jsonb,
           'options', jsonb_build_object(
               'traceparent', '00-' || md5(i::text) || '-' || left(md5(i::text), 16) || '-01')),
       'order-' || (i %% %(keys)s)
FROM generate_series(1, %(rows)s) AS i
"""


@attrs.frozen
class Services:
    """The run's own database (DSN), RabbitMQ URL (own vhost) and Redis URL (own namespace)."""

    dsn: str
    amqp_url: str
    redis_url: str
    #: A ``kafka://`` URL with topics of the run's own, and what serves it.
    kafka_url: str = ""
    kafka_server: str = ""

    def url(self, broker: str) -> str:
        """The URL of ``broker`` (``rabbitmq``, ``redis`` or ``kafka``) for this run."""
        return {"rabbitmq": self.amqp_url, "redis": self.redis_url, "kafka": self.kafka_url}[broker]

    def env(self, broker_url: str, **extra: str) -> dict[str, str]:
        """The environment of an ``estafeta`` process of this run.

        ``PYTHONPATH`` names this checkout, as ``bench.sagas`` does: run from a worktree,
        the relays run the worktree's code, not the code the virtual environment installed.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
        env["PYTHONPATH"] = str(ROOT)
        return {**env, "ESTAFETA_DATABASE_URL": self.dsn, "ESTAFETA_BROKER_URL": broker_url, **extra}


@contextlib.contextmanager
def services() -> Iterator[Services]:
    """Create the run's database (migrated), vhost, namespace and Kafka topics prefix; remove them afterwards."""
    with (
        scratch_database(admin_dsn(), _migrate) as dsn,
        rabbitmq_vhost(AMQP_URL) as amqp_url,
        redis_namespace(REDIS_URL) as redis_url,
        kafka_server() as (kafka_url, kafka_name),
    ):
        yield Services(dsn, amqp_url, redis_url, kafka_url, kafka_name)


def _migrate(dsn: str) -> None:
    env = Services(dsn, AMQP_URL, REDIS_URL).env("stub://")
    migrated = subprocess.run([str(BIN / "estafeta"), "migrate"], cwd=ROOT, env=env, capture_output=True)
    if migrated.returncode:
        raise SystemExit(f"estafeta migrate failed: {migrated.stderr.decode().strip()}")


def fill(conn: psycopg.Connection[Any], rows: int, queue: str, keys: int = 1000) -> None:
    """Write ``rows`` outbox rows for ``queue`` (``keys`` ordering keys, interleaved); commit to publish."""
    conn.execute(_FILL, {"rows": rows, "queue": queue, "keys": keys})  # type: ignore[arg-type]
    conn.execute("SELECT pg_notify('estafeta_outbox', 'pingpong')")


class RelayProcess:
    """An ``estafeta relay`` process of the run."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.popen = subprocess.Popen(
            [str(BIN / "estafeta"), "relay", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def rss_bytes(self) -> int:
        """The process's resident set size now."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.popen.returncode:
            error = self.popen.stderr.read().decode() if self.popen.stderr else ""
            raise SystemExit(f"estafeta relay exited with {self.popen.returncode}: {error.strip()[-2000:]}")


@contextlib.contextmanager
def relays(env: dict[str, str], count: int = 1, *args: str) -> Iterator[list[RelayProcess]]:
    """``count`` relays, stopped (SIGTERM) when the block ends."""
    started = [RelayProcess(env, *args) for _ in range(count)]
    try:
        yield started
    finally:
        for relay in started:
            relay.stop()


def outbox_empty(conn: psycopg.Connection[Any]) -> bool:
    """Whether the outbox holds no row: one probe of its primary key's index.

    Not ``count(*)``, which reads every row (and every row deleted since the last vacuum):
    on 20,000 rows half drained it cost the backend 1.1 ms of CPU per poll against 0.03 for
    the probe, about a tenth of a core polled every 10 ms, 0.016 CPU ms per row relayed,
    charged to PostgreSQL on the relay's two cores where raw pika's rounds have no poller.
    """
    return conn.execute("SELECT id FROM pingpong.outbox ORDER BY id LIMIT 1").fetchone() is None


def wait_empty(conn: psycopg.Connection[Any], timeout: float = 600) -> float:
    """Wait until the outbox is empty; return when (``perf_counter``)."""
    deadline = time.monotonic() + timeout
    while not outbox_empty(conn):
        if time.monotonic() > deadline:
            raise SystemExit(f"the outbox did not drain within {timeout:g} s")
        time.sleep(0.01)
    return time.perf_counter()


def warm_up(conn: psycopg.Connection[Any], queue: str, rows: int = 1) -> None:
    """Committed rows, drained: the relays are connected and the queue is declared; the outbox vacuumed.

    ``conn`` in autocommit. Each drain leaves its rows dead in the outbox and its indexes, and
    a claim walks past them: without the ``VACUUM`` that autovacuum would have run between two
    drains, each drain of a run is slower than the last (a server with autovacuum off, as
    the CI machines' is, showed PostgreSQL's CPU per row 0.05, 0.09 and 0.17 ms in three rounds).
    """
    with conn.transaction():
        fill(conn, rows, queue)
    wait_empty(conn, timeout=120)
    conn.execute("VACUUM pingpong.outbox")


def machine(dsn: str, amqp_url: str) -> dict[str, Any]:
    """What the figures were measured on, with the servers' versions."""
    import pika
    import redis

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    rabbit = connection._impl.server_properties.get("version", b"?")
    connection.close()
    client = redis.Redis.from_url(REDIS_URL)
    redis_version = client.info("server").get("redis_version", "?")
    client.close()
    return {
        **common_machine(),
        "postgresql": row[0] if row else "?",
        "rabbitmq": rabbit.decode() if isinstance(rabbit, bytes) else str(rabbit),
        "redis": redis_version,
    }
