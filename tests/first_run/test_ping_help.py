"""`estafeta ping --help` says what a pong proves, and what it does not."""

from __future__ import annotations

from click.testing import CliRunner

from estafeta_cli import main as cli_main


def test_ping_help_says_what_a_pong_proves() -> None:
    cli_main._register()
    result = CliRunner().invoke(cli_main.cli, ["ping", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "A pong proves, on the pingpong service's database and queue" in text
    assert "a relay published it and the broker delivered it" in text
    assert "It proves nothing of the other services' queues" in text
