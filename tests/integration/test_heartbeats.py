"""Heartbeats of real processes: ``dramatiq`` workers and ``estafeta relay`` on RabbitMQ, seen by ``estafeta status``.

Live while they run; stale after a SIGKILL (within three beats, on the database's clock),
with the outbox they served flagged once a row waits in it; gone after a SIGTERM.
"""

from __future__ import annotations

import json
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from estafeta_actors.pingpong import SERVICE as pingpong_service
from estafeta_actors.pingpong import Ping

from ..helpers import wait_until
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: The service whose heartbeats the test follows.
PINGPONG = pingpong_service.name
#: Seconds between beats: stale after 1.5 s without one.
INTERVAL = "0.5"


def status(env: dict[str, str]) -> dict[str, Any]:
    """``estafeta status --json``, parsed."""
    done = processes.estafeta(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def beats(env: dict[str, str], service: str, kind: str) -> list[dict[str, Any]]:
    """The heartbeat rows of ``kind`` in ``service``."""
    found = next(s for s in status(env)["services"] if s["service"] == service)
    return [row for row in found["heartbeats"] if row["kind"] == kind]


def flagged(env: dict[str, str]) -> set[tuple[str, str]]:
    """(condition, subject) of everything ``status`` flags."""
    return {(u["condition"], u["subject"]) for u in status(env)["unserved"]}


def test_status_lists_live_processes_stale_after_sigkill_and_none_after_sigterm(
    database_url: str, amqp_url: str, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, amqp_url, ESTAFETA_HEARTBEAT_INTERVAL=INTERVAL)
    workers = processes.workers(env, tmp_path, processes=1, threads=2)
    relay = processes.relay(env, tmp_path, "--lanes", "2")
    with processes.running(workers, relay):
        wait_until(lambda: len(beats(env, PINGPONG, "relay")) == 1, timeout=120, what="the relay's heartbeat")
        wait_until(lambda: len(beats(env, PINGPONG, "worker")) == 1, timeout=120, what="the worker's heartbeat")
        (relay_row,) = beats(env, PINGPONG, "relay")
        (worker_row,) = beats(env, PINGPONG, "worker")
        assert (relay_row["state"], relay_row["serves"], relay_row["threads"]) == ("live", [PINGPONG], 2)
        assert (worker_row["state"], worker_row["serves"], worker_row["threads"]) == ("live", [PINGPONG], 2)
        assert relay_row["pid"] == relay.popen.pid
        assert flagged(env) == set()

        relay.kill(signal.SIGKILL)
        relay.popen.wait(30)
        wait_until(
            lambda: [r["state"] for r in beats(env, PINGPONG, "relay")] == ["stale"],
            timeout=60,
            what="the killed relay's heartbeat gone stale",
        )
        with conn.transaction():
            pingpong_service.send(conn, Ping(uuid.uuid4(), datetime.now(UTC)))
        assert ("outbox-without-relay", PINGPONG) in flagged(env)

        second = processes.relay(env, tmp_path)
        with processes.running(second):
            wait_until(lambda: ("outbox-without-relay", PINGPONG) not in flagged(env), timeout=120, what="a relay")
            live = [r for r in beats(env, PINGPONG, "relay") if r["state"] == "live"]
            assert [r["pid"] for r in live] == [second.popen.pid]
            second.popen.send_signal(signal.SIGTERM)  # a clean stop
            assert second.popen.wait(60) == 0
        assert [r["pid"] for r in beats(env, PINGPONG, "relay")] == [relay_row["pid"]]  # only the killed one's

        # SIGTERM to the dramatiq command only: it passes it on to its worker processes once (a
        # second one, as a signal to the whole group would be, kills them without their shutdown).
        workers.popen.send_signal(signal.SIGTERM)
        assert workers.popen.wait(60) == 0
        assert beats(env, PINGPONG, "worker") == []
