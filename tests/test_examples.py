"""The examples run: a service declared outside the package, behind an idempotent HTTP endpoint."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any
from wsgiref.util import setup_testing_defaults

from examples.loyalty import service as loyalty
from examples.loyalty.http import make_app

from .helpers import scalar, wait_until
from .integration.processes import ROOT, service_env


def post(app: Any, body: Any, key: str | None) -> tuple[str, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/awards",
        "CONTENT_LENGTH": str(len(data)),
        "wsgi.input": io.BytesIO(data),
    }
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    setup_testing_defaults(environ)
    answer: dict[str, str] = {}
    chunks = app(environ, lambda status, headers: answer.setdefault("status", status))
    return answer["status"], json.loads(b"".join(chunks))


def test_a_retried_request_sends_one_command_and_awards_once(runtime, conn, stub_broker, stub_worker, running_relay):
    app = make_app(runtime)
    first = post(app, {"customer_id": "c-1", "points": 30}, "key-1")
    again = post(app, {"customer_id": "c-1", "points": 30}, "key-1")
    assert first[0].startswith("202") and again[0].startswith("200")
    assert first[1]["message_id"] == again[1]["message_id"]
    wait_until(lambda: loyalty.points(conn, "c-1") == 30, what="the award")
    post(app, {"customer_id": "c-1", "points": 5}, "key-2")
    wait_until(lambda: loyalty.points(conn, "c-1") == 35, what="the second award")
    stub_broker.join("loyalty", timeout=10_000)
    assert loyalty.points(conn, "c-1") == 35
    assert scalar(conn, "SELECT count(*) FROM loyalty.inbox") == 2


def test_bad_requests_get_a_one_line_400_and_send_nothing(runtime, conn) -> None:
    app = make_app(runtime)
    for body, key in [
        ({"customer_id": "c-1", "points": -3}, "k"),
        ({"customer_id": "c-1"}, "k"),
        (b"{not json", "k"),
        ({"customer_id": "c-1", "points": 3}, None),
    ]:
        status, answer = post(app, body, key)
        assert status.startswith("400"), answer
        assert "\n" not in answer["error"]
    assert scalar(conn, "SELECT count(*) FROM loyalty.outbox") == 0


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_manages_an_app_it_is_given(database_url: str, runtime) -> None:
    env = service_env(database_url, "stub://")
    result = _cli(env, "--app", "examples.loyalty", "outbox", "stats")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["loyalty"]
    by_variable = _cli({**env, "ESTAFETA_APP": "examples.loyalty"}, "outbox", "stats", "--service", "loyalty")
    assert by_variable.returncode == 0, by_variable.stderr
    missing = _cli(env, "--app", "examples.nothing_here", "migrate")
    assert missing.returncode == 2
    assert missing.stderr.startswith("estafeta migrate: Invalid value for --app: cannot import 'examples.nothing_here'")
    assert len(missing.stderr.splitlines()) == 1
