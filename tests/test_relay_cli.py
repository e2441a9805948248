"""``estafeta outbox stats|failed|retry``: what an operator sees of a stuck outbox, and the repair."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

from .helpers import scalar
from .integration.processes import ROOT, service_env
from .relay_support import add


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return service_env(database_url, "stub://")


@pytest.fixture
def stuck(conn, runtime) -> int:
    """One failed row (blocking key k and its follower), one row retrying, one delayed; the failed row's id."""
    add(conn, "k", 0)
    add(conn, "k", 1)
    add(conn, None, 2)
    add(conn, None, 3, delay=timedelta(hours=1))
    conn.execute(
        "UPDATE pingpong.outbox SET status = 'failed', attempts = 5, last_error = 'ConnectionRefused: boom',"
        " created_at = now() - interval '90 seconds' WHERE id = 1"
    )
    conn.execute(
        "UPDATE pingpong.outbox SET attempts = 2, last_error = 'nacked', available_at = now() + interval '1 minute',"
        " created_at = now() - interval '30 seconds' WHERE id = 3"
    )
    return 1


def test_stats_say_what_is_stuck_and_why(env, stuck: int) -> None:
    result = run(env, "outbox", "stats", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)["pingpong"]
    assert stats["oldest_pending_age_seconds"] >= 30
    del stats["oldest_pending_age_seconds"]
    assert stats == {
        "pending": 3,
        "failed": 1,
        "retrying": 1,
        "delayed": 1,
        "blocked_keys": 1,
        "oldest_error": "ConnectionRefused: boom",
    }
    table = run(env, "outbox", "stats").stdout
    assert "pingpong: oldest error: ConnectionRefused: boom" in table
    assert "estafeta outbox retry --all" in table


def test_failed_lists_rows_with_their_last_error(env, stuck: int) -> None:
    result = run(env, "outbox", "failed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pingpong #1 relaycheck.record key=k attempts=5: ConnectionRefused: boom"
    (row,) = json.loads(run(env, "outbox", "failed", "--json").stdout)
    assert row["id"] == stuck and row["last_error"] == "ConnectionRefused: boom"


def test_retry_puts_one_row_or_all_back(env, conn, stuck: int) -> None:
    missing = run(env, "outbox", "retry", "999")
    assert missing.returncode == 2
    assert "no failed outbox row 999" in missing.stderr
    assert run(env, "outbox", "retry", str(stuck)).stdout.strip() == "1 row(s) back to pending"
    assert scalar(conn, "SELECT status || attempts FROM pingpong.outbox WHERE id = %s", stuck) == "pending0"
    conn.execute("UPDATE pingpong.outbox SET status = 'failed' WHERE id IN (1, 2)")
    assert run(env, "outbox", "retry", "--all").stdout.strip() == "2 row(s) back to pending"
    assert run(env, "outbox", "failed").stdout.strip() == "no failed rows"
