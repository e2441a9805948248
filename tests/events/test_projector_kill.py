"""A projector SIGKILLed in the middle of its batches, again and again, then restarted: no event lost or doubled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from estafeta.events.projection_ops import projection_status
from estafeta.events.store import EventStore

from ..helpers import wait_until
from .support import EventSchema
from .workload import Deposited, registry, totals_of, truth

KILLS = 4


def start_projector(schema: EventSchema) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.events.projector_process", schema.dsn, schema.schema])


def in_a_batch(conn: psycopg.Connection[Any]) -> bool:
    """The projector's connection is inside a transaction (a batch), not idle between two."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = 'estafeta-projector:slow_totals' AND xact_start IS NOT NULL"
    ).fetchone()
    return bool(row and row[0])


def caught_up(conn: psycopg.Connection[Any], schema: str) -> bool:
    """The read model matches the log (a kill may land in the set-up, before its table was committed)."""
    table = conn.execute("SELECT to_regclass(format('%%I.slow_totals', %s::text))", (schema,)).fetchone()
    return bool(table and table[0]) and totals_of(conn, schema, "slow_totals") == truth(conn, schema)


@pytest.mark.heavy
@pytest.mark.integration
def test_a_projector_killed_mid_batch_and_restarted_applies_every_event_once(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    rng = random.Random(7)

    def write(count: int) -> None:
        with conn.transaction():
            for _ in range(count // 5):
                store.append(conn, f"acct-{rng.randrange(50)}", [Deposited(rng.randint(1, 9)) for _ in range(5)])

    write(3000)
    killed_mid_batch = 0
    for _ in range(KILLS):
        projector = start_projector(event_schema)
        try:
            wait_until(lambda: in_a_batch(conn), timeout=60, interval=0.002, what="a batch in flight")
            time.sleep(rng.uniform(0.0, 0.05))
            killed_mid_batch += in_a_batch(conn)
            os.kill(projector.pid, signal.SIGKILL)
        finally:
            projector.wait(timeout=30)
        write(1000)  # the log keeps growing while no projector runs
    assert killed_mid_batch >= KILLS - 1, "the kills must land inside batches"
    projector = start_projector(event_schema)
    try:
        wait_until(lambda: caught_up(conn, store.schema), timeout=120, what="the restarted projector to catch up")
        [status] = projection_status(conn, store.schema)
        assert status.events_applied == sum(t[0] for t in truth(conn, store.schema).values()) == 7000
    finally:
        projector.send_signal(signal.SIGKILL)
        projector.wait(timeout=30)
