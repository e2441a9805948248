"""``estafeta serve`` in a subprocess on a free port, and the lock that holds a request inside its transaction."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg

from .helpers import wait_until
from .integration.processes import BIN, Process, service_env
from .services import free_port


@attrs.frozen
class Server:
    """A running ``estafeta serve``."""

    process: Process
    url: str

    def client(self, **options: Any) -> httpx.Client:
        """An httpx client on the server's URL."""
        return httpx.Client(base_url=self.url, timeout=30, **options)


@contextlib.contextmanager
def serving(
    database_url: str, log_dir: Path, *args: str, app: str | None = None, env: Mapping[str, str] | None = None
) -> Iterator[Server]:
    """``estafeta [--app APP] serve ARGS`` on ``database_url`` and ``env``, answering /health; SIGTERM afterwards."""
    port = free_port()
    argv = [str(BIN / "estafeta"), *(["--app", app] if app else []), "serve", "--port", str(port), *args]
    process = Process("serve", argv, service_env(database_url, "stub://", **(env or {})), log_dir)
    server = Server(process, f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: _healthy(server), timeout=60, what=f"estafeta serve on port {port}")
        yield server
    except BaseException:
        print(f"--- estafeta serve output ---\n{process.output()[-4000:]}")
        raise
    finally:
        process.stop()


def _healthy(server: Server) -> bool:
    if server.process.popen.poll() is not None:
        raise AssertionError(
            f"estafeta serve exited with {server.process.popen.returncode}:\n{server.process.output()}"
        )
    try:
        return httpx.get(f"{server.url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def orders_table_locked(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold ``orders.orders`` in SHARE mode: a ``POST /orders`` waits at its INSERT, its transaction open.

    The request has taken its key's lock by then, so this is the deterministic "first
    request still running" of the tests; leaving the block releases it.
    """
    with psycopg.connect(database_url) as holder:
        holder.execute("LOCK TABLE orders.orders IN SHARE MODE")
        try:
            yield holder
        finally:
            holder.rollback()


def blocked_insert(conn: psycopg.Connection[Any], timeout: float = 20) -> int:
    """The pid of the server backend waiting to insert an order (once it waits)."""
    found: list[int] = []

    def waiting() -> bool:
        row = conn.execute(
            """SELECT pid FROM pg_stat_activity
               WHERE datname = current_database() AND wait_event_type = 'Lock'
                 AND query LIKE 'INSERT INTO orders.orders%%'"""
        ).fetchone()
        if row:
            found.append(int(row[0]))
        return bool(row)

    wait_until(waiting, timeout=timeout, what="a POST /orders waiting inside its transaction")
    return found[-1]


def backend_gone(conn: psycopg.Connection[Any], pid: int, timeout: float = 20) -> None:
    """Wait until the backend ``pid`` has ended (its transaction with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} still runs {timeout} s after its client died")
