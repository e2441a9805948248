"""A broker that is down or refuses the login: one line per failure from estafeta, none from pika."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from ..helpers import wait_until
from ..integration.processes import BIN, ROOT, estafeta, service_env
from ..services import free_port


def _relay_lines(env: dict[str, str], log: Path, *args: str, failures: int = 3) -> list[str]:
    """The relay's stderr once it reported ``failures`` paused publishes (then SIGTERM)."""
    with log.open("w") as out:
        relay = subprocess.Popen([str(BIN / "estafeta"), *args, "relay"], cwd=ROOT, env=env, stderr=out, text=True)
        try:
            wait_until(lambda: log.read_text().count("relay paused") >= failures, timeout=90, what="paused publishes")
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=60)
    return log.read_text().splitlines()


def _with_a_pending_row(env: dict[str, str]) -> None:
    # A ping with no relay running leaves its command in the outbox.
    assert estafeta(env, "ping", "--timeout", "0.1").returncode == 1


@pytest.fixture
def down_broker(runtime: object, database_url: str) -> dict[str, str]:
    """The environment of a relay whose broker is a port nothing listens on, with a row to publish."""
    env = service_env(database_url, f"amqp://guest:hunter2@127.0.0.1:{free_port()}/")
    _with_a_pending_row(env)
    return env


def test_a_broker_that_is_down_is_one_line_per_failure_and_none_from_pika(
    down_broker: dict[str, str], tmp_path: Path
) -> None:
    lines = _relay_lines(down_broker, tmp_path / "relay.log")
    paused = [line for line in lines if "relay paused" in line]
    assert len(paused) >= 3 and all("cannot connect to RabbitMQ" in line for line in paused), lines
    assert not [line for line in lines if "pika" in line], lines
    assert "hunter2" not in "\n".join(lines)


def test_a_refused_login_is_one_line_per_failure_and_none_from_pika(
    runtime: object, database_url: str, amqp_url: str, tmp_path: Path
) -> None:
    parts = urlsplit(amqp_url)
    wrong = urlunsplit(parts._replace(netloc=f"{parts.username}:hunter2@{parts.hostname}:{parts.port or 5672}"))
    env = service_env(database_url, wrong)
    _with_a_pending_row(env)
    lines = _relay_lines(env, tmp_path / "relay.log")
    paused = [line for line in lines if "relay paused" in line]
    assert len(paused) >= 3 and all("ACCESS_REFUSED" in line for line in paused), lines
    assert not [line for line in lines if "pika" in line], lines
    assert "hunter2" not in "\n".join(lines)
