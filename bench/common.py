"""What every benchmark needs: scratch resources of its own, and a description of the machine.

Nothing shared is touched: databases, vhosts and Redis namespaces are created for the run
and removed afterwards, so a benchmark can run beside other people's test suites (its
figures are then noisy, and the load average it prints says so).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def admin_dsn() -> str:
    """A DSN of the local server to create scratch databases from: the libpq environment, or its defaults here."""
    env = os.environ
    return psycopg.conninfo.make_conninfo(
        host=env.get("PGHOST", "127.0.0.1"),
        port=env.get("PGPORT", "5432"),
        user=env.get("PGUSER", "postgres"),
        dbname=env.get("PGDATABASE", "test"),
    )


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """``--database-url``: the PostgreSQL server the benchmark creates its scratch database on."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "host=127.0.0.1 port=5432 user=postgres dbname=test"),
        help="a PostgreSQL server to create a scratch database on",
    )


def stop(children: list[subprocess.Popen[Any]] | tuple[subprocess.Popen[Any], ...]) -> None:
    """SIGTERM every child, then wait up to 30 s for each (SIGKILL past that)."""
    for child in children:
        child.terminate()
    for child in children:
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()


def run_name() -> str:
    """A fresh name for this run's database, vhost and namespace."""
    return f"estafeta_bench_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def scratch_database(admin_dsn: str, prepare: Callable[[str], None], name: str | None = None) -> Iterator[str]:
    """A database of the run's own, set up by ``prepare(dsn)``, dropped afterwards; yields its DSN."""
    name = name or run_name()
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
            prepare(dsn)
            yield dsn
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def rabbitmq_vhost(url: str, name: str | None = None) -> Iterator[str]:
    """``url`` moved to a vhost of the run's own (needs ``rabbitmqctl`` here; else ``url`` as it is)."""
    ctl = shutil.which("rabbitmqctl")
    if not ctl:
        yield url
        return
    name = name or run_name()
    user = urlsplit(url).username or "guest"
    subprocess.run([ctl, "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run([ctl, "-q", "set_permissions", "-p", name, user, ".*", ".*", ".*"], check=True, timeout=60)
        yield urlunsplit(urlsplit(url)._replace(path="/" + name))
    finally:
        subprocess.run([ctl, "-q", "delete_vhost", name], capture_output=True, timeout=60)


@contextlib.contextmanager
def redis_namespace(url: str, name: str | None = None) -> Iterator[str]:
    """``url`` with a key namespace of the run's own (``?namespace=``), whose keys are deleted afterwards."""
    import redis

    name = name or run_name()
    try:
        yield url + ("&" if "?" in url else "?") + f"namespace={name}"
    finally:
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(f"{name}:*", count=1000):
            client.delete(key)
        client.close()


def reachable(url: str, default_port: int) -> bool:
    """Whether something listens at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def machine() -> dict[str, Any]:
    """The CPU, cores, platform and Python the figures come from, and the load when measured."""
    cpuinfo = Path("/proc/cpuinfo")
    models = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        if (cpuinfo.exists())
        else []
    )
    return {
        "cpu": models[0] if models else platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def describe(found: dict[str, Any]) -> str:
    """:func:`machine` in one line."""
    return (
        f"{found['cores']} cores, {found['cpu']}, Python {found['python']}, "
        f"load average {found['load_average_1m']} (the last minute's, the benchmark's own work included)"
    )
