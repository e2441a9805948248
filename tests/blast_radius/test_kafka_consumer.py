"""One poisoned record on Kafka: a record that kills its worker stops only itself.

Real ``dramatiq`` workers of the tests' app consume a one-partition Kafka topic (Tansu), fed
by a real relay. The first record of the partition SIGKILLs the worker process that runs it
(as an OOM kill or a segfault would). Kafka offsets cannot move past an unfinished record,
so every restarted worker gets it again, first; without a limit the partition would stall
for ever behind it. The inbox counts its deliveries in PostgreSQL before the work starts:
past ``ESTAFETA_MAX_DELIVERIES`` it is parked with its reason, and the records behind it
are processed, each once. A slow record runs beside the killer at every kill: the kill is
not its own, and it is processed, not parked with the killer (a record delivered again
after its delivery died runs alone in its process, and only then is counted).
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
from ..integration import processes
from ..probe import SERVICE as probe
from ..steps import Crash, Explode, Linger

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: Healthy records behind the poisoned one.
HEALTHY = 20


def processed(conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM probe.pings WHERE ping_id = ANY(%s)", pings))


def died_or_done(workers: processes.Process, conn: psycopg.Connection[Any], pings: list[uuid.UUID]) -> bool:
    parked = inbox.list_dead_letters(conn, "probe")
    assert len(parked) <= 1, f"more than the killer parked: {[letter['consumer'] for letter in parked]}"
    return workers.popen.poll() is not None or processed(conn, pings) == len(pings)


def test_a_record_that_kills_its_worker_is_parked_and_its_partition_moves_on(
    database_url: str, kafka_url: str, runtime, conn, tmp_path: Path
) -> None:
    # One partition: the killer comes first in the only offset order there is.
    env = processes.service_env(
        database_url, f"{kafka_url}&partitions=1", ESTAFETA_APP="tests.app", ESTAFETA_MAX_DELIVERIES="2"
    )
    pings = [uuid.uuid4() for _ in range(HEALTHY)]
    with conn.transaction():
        # The killer works half a second first; the record after it, started beside it by the
        # second thread, is still at work then (3 s): in flight at both kills.
        probe.send(conn, Crash(uuid.uuid4(), after_s=0.5))
        probe.send(conn, Linger(pings[0], seconds=3))
        for ping in pings[1:]:
            probe.send(conn, Explode(ping, times=0))
    killed = 0
    with processes.running(processes.relay(env, tmp_path)):
        while processed(conn, pings) < HEALTHY:
            assert killed <= 2, "the record was not parked after ESTAFETA_MAX_DELIVERIES"
            workers = processes.workers(env, tmp_path, module="tests.worker", threads=2)
            with processes.running(workers):
                wait_until(
                    functools.partial(died_or_done, workers, conn, pings),
                    timeout=90,
                    what="a worker killed by its record, or every other record processed",
                )
                killed += workers.popen.poll() is not None
    assert killed == 2
    # Each healthy record took effect once, however often a killed worker's offsets sent it again.
    assert scalar(conn, "SELECT count(*) FROM probe.pings") == HEALTHY
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert letter["consumer"] == "probe.test_crash", letter["consumer"]
    assert "delivered 3 times without finishing (does it kill its worker?)" in letter["reason"]
