"""Private ``redis-server`` processes for tests that stop a server (never the shared one)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from .services import require


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A ``redis-server`` of this test's own, on its own port, without persistence."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers."""
        binary = shutil.which("redis-server")
        assert binary is not None
        log = (self.directory / f"redis-{self.port}.log").open("ab")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.directory,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
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

    def stop(self) -> None:
        """SIGKILL this server (its data is gone, like a crashed server without persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)


@contextmanager
def redis_servers(count: int, directory: Path) -> Iterator[list[RedisServer]]:
    """``count`` private Redis servers, killed when the block ends."""
    require("redis-server", shutil.which("redis-server") is not None, "redis-server is not on PATH")
    servers = [RedisServer(directory) for _ in range(count)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            with suppress(Exception):
                server.stop()
