"""Every command that falls back to the embedded database says so on stderr, once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ..integration.processes import BIN, service_env


@pytest.mark.heavy
def test_every_command_on_the_embedded_database_says_so_once(tmp_path: Path) -> None:
    env = {**service_env("embedded", "stub://"), "ESTAFETA_APP": "examples.welcome"}
    del env["ESTAFETA_DATABASE_URL"]  # the default: the embedded PostgreSQL
    data = tmp_path / ".estafeta" / "pgdata"
    for args in (["migrate"], ["outbox", "stats"], ["dead-letters", "list"], ["prune", "--dry-run"]):
        result = subprocess.run(
            [str(BIN / "estafeta"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        command = " ".join(arg for arg in args if not arg.startswith("-"))
        assert result.stderr.splitlines() == [
            f"estafeta: this command (estafeta {command}) uses the embedded PostgreSQL"
            f" (ESTAFETA_DATABASE_URL=embedded), its data in {data}: for trying estafeta out, not for production"
        ]
