"""`estafeta serve` binds its ports before it announces them: a busy port or a bad host is one line, exit 2."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ..integration.processes import estafeta, service_env
from ..services import free_port


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port this test listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _refusal(result_stderr: str) -> str:
    lines = result_stderr.strip().splitlines()
    assert len(lines) == 1, result_stderr
    assert "serving" not in result_stderr and "Traceback" not in result_stderr
    return lines[0]


def test_a_busy_port_is_one_line_exit_2_before_anything_is_announced(database_url: str, busy_port: int) -> None:
    result = estafeta(service_env(database_url, "stub://"), "serve", "--port", str(busy_port))
    assert result.returncode == 2, result.stderr
    assert _refusal(result.stderr) == (
        f"estafeta serve: Invalid value for --port: 127.0.0.1:{busy_port} is in use (another process listens there):"
        " stop it or choose another --port"
    )


def test_a_busy_console_port_names_the_console_port(database_url: str, busy_port: int) -> None:
    env = service_env(database_url, "stub://")
    result = estafeta(env, "serve", "--port", str(free_port()), "--console-port", str(busy_port))
    assert result.returncode == 2, result.stderr
    expected = f"estafeta serve: Invalid value for --console-port: 127.0.0.1:{busy_port} is in use"
    assert _refusal(result.stderr).startswith(expected)


def test_a_host_that_does_not_resolve_is_one_line_exit_2(database_url: str) -> None:
    env = service_env(database_url, "stub://")
    result = estafeta(env, "serve", "--host", "no-such-host.invalid", "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert _refusal(result.stderr).startswith(
        "estafeta serve: Invalid value for --host: cannot listen on no-such-host.invalid:"
    )
