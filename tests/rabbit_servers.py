"""Private RabbitMQ nodes started by the suite: one node, or a cluster of three (never the shared server).

Each node is Debian's ``rabbitmq-server`` with a node name, AMQP port, distribution port,
data and log directories of its own; the nodes of a cluster share one ``HOME`` (so one
Erlang cookie) and join the first with ``rabbitmqctl stop_app; join_cluster; start_app``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .services import free_port, require

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
#: Erlang flags for a shared two-core machine: one scheduler, and no busy-waiting when idle.
ERL_ARGS = "+S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none"


class RabbitNode:
    """One private RabbitMQ node: start it, kill it (SIGKILL), start it again, stop its app."""

    def __init__(self, home: Path, name: str, *, address: str = "127.0.0.1", netns: str | None = None) -> None:
        self.home = home
        self.address = address
        #: Commands run inside this network namespace (the fault harness's), when given.
        self.prefix = ["ip", "netns", "exec", netns] if netns else []
        self.node = f"{name}@localhost"
        self.port, self.dist_port = free_port(), free_port()
        base = home / name
        base.mkdir(parents=True)
        (base / "rabbitmq.conf").write_text(f"listeners.tcp.local = {address}:{self.port}\nloopback_users = none\n")
        (base / "enabled_plugins").write_text("[].\n")
        (base / "env.conf").write_text("")
        self.pid_file = base / "pid"
        self.env = {
            **os.environ,
            "HOME": str(home),  # the Erlang cookie of this node (and of its cluster)
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
            # Inside a namespace, 127.0.0.1 is that namespace's own loopback: the node starts an
            # epmd of its own there, and rabbitmqctl (run in the same namespace) finds it.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def url(self, vhost: str = "%2F") -> str:
        """An AMQP URL of this node (guest/guest)."""
        return f"amqp://guest:guest@{self.address}:{self.port}/{vhost}"

    @property
    def host(self) -> str:
        """``address:port``, for a URL naming several nodes."""
        return f"{self.address}:{self.port}"

    def ctl(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n <node> args``; its output."""
        done = subprocess.run(
            [*self.prefix, str(RABBITMQ_BIN / "rabbitmqctl"), "-q", "-n", self.node, *args],
            env=self.env, check=True, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return done.stdout

    def start(self) -> None:
        """Start the node (detached); :meth:`wait` for it."""
        subprocess.run([*self.prefix, str(RABBITMQ_BIN / "rabbitmq-server"), "-detached"], env=self.env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip

    def wait(self) -> None:
        """Wait until the node's app runs."""
        self.ctl("wait", str(self.pid_file), "--timeout", "180", timeout=200)
        self.ctl("await_startup", "--timeout", "180", timeout=200)

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM: no goodbye to its clients or its cluster."""
        pid = int(self.pid_file.read_text().strip())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.node} (pid {pid}) still alive 30 s after SIGKILL")

    def stop(self) -> None:
        """Stop the node, or kill it if it does not answer."""
        try:
            self.ctl("stop", timeout=60)
        except subprocess.SubprocessError:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGKILL)


def _require_binaries() -> None:
    server = RABBITMQ_BIN / "rabbitmq-server"
    require("RabbitMQ (a private node)", server.exists() and (RABBITMQ_BIN / "rabbitmqctl").exists(), f"no {server}")


@contextlib.contextmanager
def _home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="estafeta-rabbit-"))
    cookie = home / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(16).upper())  # written before any node starts: one cookie for all
    cookie.chmod(0o400)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def private_rabbitmq_node(*, address: str = "127.0.0.1", netns: str | None = None) -> Iterator[RabbitNode]:
    """A RabbitMQ node of this test's own; with ``netns``, inside that network namespace, on ``address``."""
    _require_binaries()
    with _home() as home:
        node = RabbitNode(home, f"estafeta-{uuid.uuid4().hex[:8]}", address=address, netns=netns)
        node.start()
        try:
            node.wait()
            yield node
        finally:
            node.stop()


@contextlib.contextmanager
def rabbitmq_cluster(size: int = 3) -> Iterator[list[RabbitNode]]:
    """``size`` private RabbitMQ nodes clustered with the first (started side by side)."""
    _require_binaries()
    with _home() as home:
        name = f"estafeta-{uuid.uuid4().hex[:6]}"
        nodes = [RabbitNode(home, f"{name}-{i}") for i in range(1, size + 1)]
        try:
            for node in nodes:
                node.start()
            with ThreadPoolExecutor(size) as pool:
                list(pool.map(RabbitNode.wait, nodes))
            for node in nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", nodes[0].node)
                node.ctl("start_app")
            yield nodes
        finally:
            with ThreadPoolExecutor(size) as pool:
                list(pool.map(RabbitNode.stop, nodes))
