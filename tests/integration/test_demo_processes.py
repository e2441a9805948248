"""``estafeta demo`` on RabbitMQ leaves no worker behind when it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import wait_until
from .processes import ROOT, service_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.heavy,
    pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's"),
]


def _stat(pid: int | str) -> tuple[str, int] | None:
    """A process's state and parent from ``/proc``; ``None`` once it is gone or a zombie (exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (fields[0], int(fields[1]))


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    parents = {int(e.name): stat[1] for e in Path("/proc").iterdir() if e.name.isdigit() and (stat := _stat(e.name))}
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _stat(pid) is not None}


def test_the_demo_s_workers_stop_when_the_demo_is_killed(amqp_url: str, database_url: str, runtime) -> None:
    # The workers run in a session of their own (a Ctrl-C is the demo's to handle): killed
    # with SIGKILL, the demo cannot stop them, and without the parent-death signal they
    # went on taking the run's messages (seen when a test's timeout killed the Kafka demo).
    env = service_env(database_url, amqp_url, ESTAFETA_SAGA_STEP_TIMEOUT="30")
    demo = subprocess.Popen(
        [sys.executable, "-m", "estafeta_cli", "demo", "--orders", "500", "--processes", "1", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: set[int] = set()
    try:
        # The workers' process and the Dramatiq worker process it forks.
        wait_until(lambda: len(_descendants(demo.pid)) >= 2, timeout=60, what="the demo's worker processes")
        workers = _descendants(demo.pid)
        demo.send_signal(signal.SIGKILL)
        demo.wait(10)
        wait_until(lambda: not _alive(workers), timeout=60, what=f"the killed demo's workers {sorted(workers)} to stop")
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in _alive(workers):
            os.kill(pid, signal.SIGKILL)
