"""A message that keeps killing its worker is parked at ``ESTAFETA_MAX_WORKER_DEATHS``, not ``MAX_DELIVERIES``.

Real ``dramatiq`` worker processes on RabbitMQ, restarted whenever one dies, and a step that
SIGKILLs its own process for one message among good ones. Deliveries that die with their
process are counted apart from deliveries that fail: a step that raises is retried up to
``ESTAFETA_MAX_DELIVERIES`` (25 by default), a message that kills its worker is parked at
its third death (the default limit), with the reason, and every good message takes effect once.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from estafeta_sql import inbox

from ..helpers import scalar, wait_until
from ..probe import SERVICE as probe
from ..steps import Crash, Explode, Linger
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: ESTAFETA_MAX_WORKER_DEATHS's default.
DEATHS = 3


def processed(conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> int:
    return int(scalar(conn, "SELECT count(DISTINCT ping_id) FROM probe.pings WHERE ping_id = ANY(%s)", pings))


def died_or_done(workers: processes.Process, conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> bool:
    parked = inbox.list_dead_letters(conn, "probe")
    assert len(parked) <= 1, f"more than the killer parked: {[letter['reason'] for letter in parked]}"
    return workers.popen.poll() is not None or (processed(conn, pings) == len(pings) and bool(parked))


def test_a_message_that_kills_its_worker_is_parked_after_three_deaths_not_25_deliveries(
    database_url: str, amqp_url: str, runtime, conn, tmp_path: Path
) -> None:
    # ESTAFETA_MAX_DELIVERIES and ESTAFETA_MAX_WORKER_DEATHS at their defaults (25 and 3).
    env = processes.service_env(database_url, amqp_url, ESTAFETA_APP="tests.app")
    pings = [uuid.uuid4() for _ in range(30)]
    with conn.transaction():
        # The killer works half a second first; the message after it, started beside it by
        # the second thread, is still at work then: in flight at the first kill.
        probe.send(conn, Crash(uuid.uuid4(), after_s=0.5))
        probe.send(conn, Linger(pings[0], seconds=2))
        for ping in pings[1:]:
            probe.send(conn, Explode(ping, times=0))
    killed = 0
    with processes.running(processes.relay(env, tmp_path)):
        while not (processed(conn, pings) == len(pings) and inbox.list_dead_letters(conn, "probe")):
            assert killed <= DEATHS, f"the killer was not parked after {DEATHS} deaths"
            workers = processes.workers(env, tmp_path, module="tests.worker", threads=2)
            with processes.running(workers):
                wait_until(
                    functools.partial(died_or_done, workers, conn, pings),
                    timeout=90,
                    what="a worker killed by its message, or every good message processed and the killer parked",
                )
                if workers.popen.poll() is not None:
                    assert workers.popen.returncode == 1  # dramatiq's exit when a worker process died of a signal
                    killed += 1
    assert killed == DEATHS
    # Each good message took effect once, those in flight beside the killer included.
    assert scalar(conn, "SELECT count(*) FROM probe.pings WHERE ping_id = ANY(%s)", pings) == len(pings)
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert letter["consumer"] == "probe.test_crash"
    assert f"killed its worker {DEATHS} times" in letter["reason"], letter["reason"]
    assert scalar(conn, "SELECT count(*) FROM probe.inbox_attempts") == 0
