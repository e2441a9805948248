"""Checks shared by the order-system runs on private PostgreSQL servers (failover, separate servers)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from estafeta_actors.kill_and_recover import KillAndRecover

from .processes import BIN, Process, estafeta

SERVICES = ("orders", "payments", "inventory", "notifications")


def steps_committed_since(dsns: Mapping[str, str], since: float) -> int:
    """Steps (inbox rows) committed on the services' servers since ``since`` (``time.time()``, one clock)."""
    total = 0
    for service, dsn in dsns.items():
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            query = f"SELECT count(*) FROM {service}.inbox WHERE processed_at > to_timestamp(%s)"
            row = conn.execute(query, (since,)).fetchone()
        total += int(row[0]) if row else 0
    return total


def pending_outbox_rows(dsns: Mapping[str, str]) -> dict[str, int]:
    """Rows still waiting in each service's outbox."""
    pending = {}
    for service, dsn in dsns.items():
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT count(*) FROM {service}.outbox").fetchone()
        pending[service] = int(row[0]) if row else 0
    return pending


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> float:
    """Poll ``check`` until it holds (a server still coming up counts as not yet); the seconds it took."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except psycopg.OperationalError:
            pass
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def projections_caught_up(env: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """Every projection of the order system (``estafeta projections status``), if each is running with no lag."""
    done = estafeta(env, "projections", "status", "--json")
    if done.returncode:
        return None
    found: list[dict[str, Any]] = json.loads(done.stdout)["projections"]
    ok = found and all(p["state"] == "running" and p["lag_events"] == 0 and not p["last_error"] for p in found)
    return found if ok else None


def applications(dsn: str) -> set[str]:
    """The ``application_name`` of every estafeta connection to ``dsn``'s server now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE 'estafeta-%%'"
        ).fetchall()
    return {str(row[0]) for row in rows}


class OrderRun(KillAndRecover):
    """The kill run with ``estafeta projections run`` beside the workers and the relay.

    The projector starts with the workers and is left running when the run ends (the test
    checks it caught up, then calls :meth:`stop_projector`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.projector: Process | None = None

    def start(self, *, relay: bool = True) -> None:
        super().start(relay=relay)
        if self.projector is None:
            argv = [str(BIN / "estafeta"), "projections", "run", "--poll-interval", "0.2"]
            self.projector = Process("projections", argv, self.env, self.log_dir)

    def stop_projector(self) -> None:
        if self.projector is not None:
            self.projector.stop()
