"""The runtime needs no web framework; ``estafeta serve`` says what to install when the http extra is missing."""

from __future__ import annotations

import subprocess
import sys

from .integration.processes import ROOT, service_env
from .services import scratch_database

#: Make these imports fail, as in an environment without ``estafeta[http]``.
_WITHOUT_HTTP = (
    "import sys\nfor name in ('fastapi', 'starlette', 'uvicorn', 'jinja2', 'pydantic'): sys.modules[name] = None\n"
)


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_HTTP + code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_estafeta_and_the_order_system_import_without_the_http_extra() -> None:
    run = _python(
        "import estafeta, estafeta_cli.main\n"
        "from estafeta_actors.app import app\n"
        "from estafeta_actors.orders import IDEMPOTENCY\n"
        "print(IDEMPOTENCY.ttl, 'idempotency_keys' in str(app.service('orders').migrations()))"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "day,", "0:00:00", "True"]


def test_serve_without_the_http_extra_is_one_line_and_exit_code_2() -> None:
    run = _python("from estafeta_cli.main import main\nmain(['serve'])")
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "estafeta serve: needs fastapi, uvicorn, jinja2: pip install 'estafeta[http]'"
    ]


def test_serve_refuses_an_unmigrated_database() -> None:
    with scratch_database() as dsn:
        run = subprocess.run(
            [sys.executable, "-m", "estafeta_cli", "serve"],
            cwd=ROOT, env=service_env(dsn, "stub://"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert run.returncode == 1
    assert "not migrated: run `estafeta migrate` first" in run.stderr
