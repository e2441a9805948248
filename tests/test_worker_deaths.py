"""Deliveries that die with their process are counted apart from those that fail (``estafeta.steps.worker_deaths``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import attrs
import pytest

from estafeta import Runtime, deliver
from estafeta.operations.dead_letter_causes import cause_of
from estafeta_sql import inbox
from tests.app import STEPS

from .helpers import message_for, scalar
from .integration.processes import ROOT
from .steps import ATTEMPTS, Crash, Explode

EXPLODE = STEPS["probe.test_explode"]
CRASH = STEPS["probe.test_crash"]

#: A process that delivers one message to ``probe.test_crash``, which SIGKILLs it.
KILLED_DELIVERY = """
import sys, uuid
from estafeta import Runtime, Settings, deliver
from estafeta.testing import TEST_SETTINGS
from tests.app import STEPS
from tests.helpers import message_for
from tests.steps import Crash
message = message_for("probe.test_crash", Crash(uuid.UUID(sys.argv[2])), message_id=uuid.UUID(sys.argv[3]))
deliver(STEPS["probe.test_crash"], Runtime(Settings(database_url=sys.argv[1], **TEST_SETTINGS)), message)
"""


@pytest.fixture
def one_death(runtime: Runtime) -> Iterator[Runtime]:
    """The suite's runtime, with a message parked at its first death."""
    limited = Runtime(attrs.evolve(runtime.settings, max_worker_deaths=1))
    yield limited
    limited.close()


def test_a_step_that_raises_is_retried_as_a_failure_and_counts_no_death(one_death: Runtime, conn) -> None:
    ping_id = uuid.uuid4()
    message = message_for("probe.test_explode", Explode(ping_id, times=3))
    for attempt in (1, 2, 3):
        with pytest.raises(RuntimeError, match="boom"):
            deliver(EXPLODE, one_death, message)
        assert conn.execute("SELECT attempts, deaths, unfinished FROM probe.inbox_attempts").fetchone() == (
            attempt,
            0,
            False,
        )
    assert deliver(EXPLODE, one_death, message) == "ok"
    assert ATTEMPTS[ping_id] == 4
    assert inbox.list_dead_letters(conn, "probe") == []


def test_a_delivery_killed_with_its_process_counts_a_death_and_parks_the_message_at_the_limit(
    database_url: str, one_death: Runtime, conn
) -> None:
    ping_id, message_id = uuid.uuid4(), uuid.uuid4()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_DELIVERY, database_url, str(ping_id), str(message_id)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Counted before its work, and never ended: it died with its process.
    assert conn.execute("SELECT attempts, deaths, unfinished FROM probe.inbox_attempts").fetchone() == (1, 0, True)
    message = message_for("probe.test_crash", Crash(ping_id), message_id=message_id)
    assert deliver(CRASH, one_death, message) == "dead_lettered"  # parked without running (it would kill this one)
    (letter,) = inbox.list_dead_letters(conn, "probe")
    assert "killed its worker 1 time:" in letter["reason"], letter["reason"]
    assert cause_of(letter["consumer"], letter["reason"]).error == "KilledItsWorker"  # its group in the console
    assert scalar(conn, "SELECT count(*) FROM probe.inbox_attempts") == 0
