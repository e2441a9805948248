"""The command line: help everywhere, one-line errors with exit code 2, the ping round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from estafeta_cli import main as cli_main

from .integration.processes import ROOT, service_env


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


cli_main._register()
ALL_COMMANDS = sorted(_commands(cli_main.cli))


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=" ".join)
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli_main.cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert len(result.output.splitlines()) > 3


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return service_env(database_url, "stub://")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["relay", "--batch-size", "many"], "estafeta relay: Invalid value for '--batch-size'"),
        (["relay"], "estafeta relay: ESTAFETA_BROKER_URL is stub://"),
        (["outbox", "retry"], "estafeta outbox retry: give a ROW_ID or --all"),
        (["outbox", "retry", "424242"], "estafeta outbox retry: Invalid value for ROW_ID: no failed outbox row"),
        (["outbox", "stats", "--service", "nope"], "estafeta outbox stats: Invalid value for --service"),
        (["migrate", "--service", "nope"], "estafeta migrate: Invalid value for --service"),
        (["no-such-command"], "estafeta: No such command 'no-such-command'"),
        (["serve", "--console-host", "0.0.0.0"], "estafeta serve: Invalid value for --console-host"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(env: dict[str, str], args: list[str], expected: str) -> None:
    result = run(env, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(expected), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_bad_setting_is_one_line_and_exit_code_2_without_the_password(env: dict[str, str]) -> None:
    result = run({**env, "ESTAFETA_BROKER_URL": "amqp://guest:hunter2@rabbit:notaport/"}, "outbox", "stats")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "ESTAFETA_BROKER_URL" in result.stderr and "hunter2" not in result.stderr


def test_unreachable_database_is_one_line_exit_1(env: dict[str, str]) -> None:
    dsn = "host=127.0.0.1 port=1 user=estafeta password=hunter2 dbname=nowhere connect_timeout=1"
    result = run({**env, "ESTAFETA_DATABASE_URL": dsn, "ESTAFETA_POOL_SIZE": "1"}, "outbox", "stats")
    assert result.returncode == 1
    assert result.stderr.startswith("estafeta: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "hunter2" not in result.stderr


def test_ping_round_trip_on_the_stub_broker(env: dict[str, str], runtime) -> None:
    result = run(env, "ping")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pong ") and "(effects: 1)" in result.stdout


def test_outbox_stats_json_lists_every_service(env: dict[str, str], runtime) -> None:
    result = run(env, "outbox", "stats", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert set(stats) >= {"pingpong", "orders", "payments", "inventory", "notifications"}
    assert stats["pingpong"]["pending"] == 0 and stats["pingpong"]["failed"] == 0
