"""Private ``redis-server`` processes for tests that stop a server (never the shared one).

A server can run inside a network namespace a test made (``netns``), listening on that
namespace's address (``host``): the network fault tests cut it off from its clients.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from .services import free_port, require


class RedisServer:
    """A ``redis-server`` of this test's own, on its own port, without persistence."""

    def __init__(self, directory: Path, *, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.port = free_port()
        self.host = host
        self.netns = netns
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers."""
        binary = shutil.which("redis-server")
        assert binary is not None
        log = (self.directory / f"redis-{self.port}.log").open("ab")
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        # Off loopback (a namespace's address), protected mode would refuse every client.
        unprotected = ["--protected-mode", "no"] if self.netns else []
        argv = [binary, "--port", str(self.port), "--bind", self.host, "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*prefix, *argv, *unprotected],
            cwd=self.directory,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if self.netns:
            self._wait_in_namespace()
            return
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def _wait_in_namespace(self) -> None:
        assert self.netns is not None
        ping = ["ip", "netns", "exec", self.netns, "redis-cli", "-h", self.host, "-p", str(self.port), "ping"]
        deadline = time.monotonic() + 10
        while subprocess.run(ping, capture_output=True, text=True, check=False).stdout.strip() != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server in {self.netns} did not answer on {self.host}:{self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL this server (its data is gone, like a crashed server without persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=2)


@contextmanager
def redis_servers(
    count: int, directory: Path, *, host: str = "127.0.0.1", netns: str | None = None
) -> Iterator[list[RedisServer]]:
    """``count`` private Redis servers (in ``netns`` on ``host``, if given), killed when the block ends."""
    require("redis-server", shutil.which("redis-server") is not None, "redis-server is not on PATH")
    servers = [RedisServer(directory, host=host, netns=netns) for _ in range(count)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            with suppress(Exception):
                server.stop()
