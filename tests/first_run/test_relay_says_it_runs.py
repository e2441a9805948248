"""The relay says at start what it drains and where to (password masked), and at -v one line per batch."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from ..helpers import wait_until
from ..integration.processes import BIN, ROOT, estafeta, service_env


def test_the_relay_says_at_start_its_outboxes_broker_and_lanes(database_url: str, tmp_path: Path) -> None:
    env = service_env(database_url, "amqp://guest:hunter2@127.0.0.1:1/shop")
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        relay = subprocess.Popen(
            [str(BIN / "estafeta"), "relay", "--service", "orders", "--service", "payments", "--lanes", "3"],
            cwd=ROOT, env=env, stderr=out, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: "\n" in log.read_text(), timeout=60, what="the relay's first line")
        finally:
            relay.terminate()
            relay.wait(timeout=60)
    assert log.read_text().splitlines()[0] == (
        "estafeta: relay publishing the outboxes of orders, payments to amqp://guest:***@127.0.0.1:1/shop,"
        " in 3 lanes, until SIGTERM"
    )


def test_the_relay_logs_a_line_per_batch_at_v(runtime: object, database_url: str, amqp_url: str) -> None:
    env = service_env(database_url, amqp_url)
    assert estafeta(env, "ping", "--timeout", "0.1").returncode == 1  # leaves its command in the outbox
    result = subprocess.run(
        [str(BIN / "estafeta"), "-v", "relay", "--once", "--service", "pingpong"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "published 1"
    lines = result.stderr.splitlines()
    password = urlsplit(amqp_url).password
    assert lines[0].startswith("estafeta: relay publishing the outboxes of pingpong to amqp://"), lines
    assert lines[0].endswith(", once") and f":{password}@" not in lines[0]
    assert [line for line in lines if "relay pingpong: claimed 1, published 1, failed 0" in line], lines
