"""Schemathesis against the OpenAPI document ``estafeta serve`` serves: every check, a bounded run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ..http_server import serving
from .processes import BIN, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: Test cases per operation and phase: enough to find what the schema and the server disagree
#: on, small enough for the suite (about half a minute on 2 cores).
MAX_EXAMPLES = 30


def test_the_server_keeps_every_promise_of_its_openapi_document(database_url: str, runtime, tmp_path: Path) -> None:
    with serving(database_url, tmp_path, "--no-access-log") as server:
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
        run = subprocess.run(
            [
                str(BIN / "schemathesis"), "run", f"{server.url}/openapi.json",
                "--checks", "all",
                "--max-examples", str(MAX_EXAMPLES),
                "--seed", "13",
                "--workers", "1",
                "--request-timeout", "30",
            ],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "passed" in run.stdout
