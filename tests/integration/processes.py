"""Real worker and relay processes for integration tests, killed with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def service_env(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    """The environment of estafeta processes for one test: its database and broker, tiny backoffs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
    env.update(
        ESTAFETA_DATABASE_URL=database_url,
        ESTAFETA_BROKER_URL=broker_url,
        ESTAFETA_MIN_BACKOFF_MS="50",
        ESTAFETA_MAX_BACKOFF_MS="500",
        ESTAFETA_RELAY_POLL_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


class Process:
    """A child process in its own process group, with its output kept in a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path, *, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.log = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log_file = self.log.open("wb")
        self.popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (a worker's children too)."""
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``; then SIGKILL to what is left of its group.

        A ``dramatiq`` worker process can outlive its main one (one hung at its start, as
        under ``opentelemetry-instrument`` in CI) and would go on serving the session's
        database, re-sending the next tests' sagas from its watchdog.
        """
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.popen.wait(10)
        self.kill(signal.SIGKILL)
        self._log_file.close()
        return self.popen.returncode

    def output(self) -> str:
        """What it printed so far."""
        self._log_file.flush()
        return self.log.read_text(errors="replace")


def workers(
    env: Mapping[str, str], log_dir: Path, *, processes: int = 1, threads: int = 4, module: str = "estafeta_actors"
) -> Process:
    """``dramatiq <module>`` worker processes."""
    argv = [str(BIN / "dramatiq"), module, "--processes", str(processes), "--threads", str(threads)]
    return Process("workers", argv, env, log_dir)


def relay(env: Mapping[str, str], log_dir: Path, *args: str) -> Process:
    """``estafeta relay`` with ``args``."""
    return Process("relay", [str(BIN / "estafeta"), "relay", *args], env, log_dir)


def estafeta(env: Mapping[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run an ``estafeta`` command to completion."""
    return subprocess.run(
        [str(BIN / "estafeta"), *args], cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def running(*procs: Process) -> Iterator[tuple[Process, ...]]:
    """Stop ``procs`` when the block ends (their logs are printed if the test failed)."""
    try:
        yield procs
    except BaseException:
        for proc in procs:
            print(f"--- {proc.name} output ---\n{proc.output()[-4000:]}")
        raise
    finally:
        for proc in procs:
            proc.stop()
