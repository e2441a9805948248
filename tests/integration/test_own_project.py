"""estafeta in a team's own project: `dramatiq` workers and `estafeta relay` for an app that is not the shop.

The README's minimal app (examples/booking) run as its README says; and a module written
outside the repository, in a fresh virtualenv where estafeta was installed with
``pip install``, which imports only ``estafeta``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from ..helpers import scalar, wait_until
from ..services import scratch_database
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def _schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_%'").fetchall()
    return {str(r[0]) for r in rows} - {"public", "information_schema"}


def _saga_statuses(conn: psycopg.Connection[object]) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT status FROM desk.saga_booking ORDER BY status").fetchall()]


def test_the_minimal_app_runs_on_rabbitmq_with_dramatiq_and_estafeta_relay(amqp_url: str, tmp_path: Path) -> None:
    with scratch_database() as dsn:
        env = {**processes.service_env(dsn, amqp_url), "ESTAFETA_APP": "examples.booking"}
        migrated = processes.estafeta(env, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert _schemas(dsn) == {"desk"}
        book = (
            "import examples.booking as b, psycopg, sys\n"
            "with psycopg.connect(sys.argv[1]) as conn:\n"
            "    conn.execute(\"INSERT INTO desk.wallets VALUES ('ann', 500), ('bob', 50)\")\n"
            "    b.book(conn, 'ann', 2); b.book(conn, 'bob', 2)\n"
        )
        placed = subprocess.run([sys.executable, "-c", book, dsn], cwd=processes.ROOT, env=env, timeout=60)
        assert placed.returncode == 0
        workers = processes.workers(env, tmp_path, module="examples.booking")
        relay = processes.relay(env, tmp_path)
        with psycopg.connect(dsn, autocommit=True) as conn, processes.running(workers, relay):
            wait_until(
                lambda: _saga_statuses(conn) == ["compensated", "completed"], timeout=60, what="both sagas to end"
            )
            assert scalar(conn, "SELECT balance FROM desk.wallets WHERE guest = 'ann'") == 300
            assert scalar(conn, "SELECT balance FROM desk.wallets WHERE guest = 'bob'") == 50
        assert _schemas(dsn) == {"desk"}


_OWN_APP = '''
"""A team's own service: greetings recorded, then counted, through the outbox."""
import uuid
from pathlib import Path

import attrs
from estafeta import App, Service, StepContext

greeter = Service("greeter", migrations=Path(__file__).parent / "greeter_migrations")
app = App("greetings", services=[greeter])


@attrs.frozen
class Greet:
    name: str


@attrs.frozen
class Count:
    name: str


@greeter.step(Greet)
def greet(ctx: StepContext, command: Greet) -> None:
    ctx.conn.execute("INSERT INTO greeter.greetings (name) VALUES (%s)", (command.name,))
    ctx.send(Count(command.name))


@greeter.step(Count)
def count(ctx: StepContext, command: Count) -> None:
    ctx.conn.execute("UPDATE greeter.greetings SET counted = counted + 1 WHERE name = %s", (command.name,))


broker = app.bind().broker
'''


@pytest.mark.timeout(600)
def test_a_module_outside_the_repository_runs_on_estafeta_installed_with_pip(amqp_url: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(processes.ROOT)],
        capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-2000:]
    project = tmp_path / "project"
    (project / "greeter_migrations").mkdir(parents=True)
    (project / "greetings.py").write_text(textwrap.dedent(_OWN_APP))
    (project / "greeter_migrations" / "0001_greetings.sql").write_text(
        "CREATE TABLE greetings (name text PRIMARY KEY, counted int NOT NULL DEFAULT 0);\n"
    )
    with scratch_database() as dsn:
        env = {
            **processes.service_env(dsn, amqp_url),
            "PYTHONPATH": str(project),  # the project's own module, and nothing of the repository
            "ESTAFETA_APP": "greetings",
        }
        bin_ = venv / "bin"

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(list(argv), cwd=project, env=env, capture_output=True, text=True, timeout=120)

        assert run(str(bin_ / "estafeta"), "migrate").returncode == 0
        names = [f"ann-{uuid.uuid4().hex[:4]}", f"bob-{uuid.uuid4().hex[:4]}"]
        send = (
            "import sys, psycopg, greetings\n"
            "with psycopg.connect(sys.argv[1]) as conn:\n"
            "    for name in sys.argv[2:]:\n"
            "        greetings.greeter.send(conn, greetings.Greet(name))\n"
        )
        sent = run(str(bin_ / "python"), "-c", send, dsn, *names)
        assert sent.returncode == 0, sent.stderr
        dramatiq = [str(bin_ / "dramatiq"), "greetings", "--processes", "1"]
        worker = processes.Process("workers", dramatiq, env, tmp_path, cwd=project)
        relay = processes.Process("relay", [str(bin_ / "estafeta"), "relay"], env, tmp_path, cwd=project)
        with psycopg.connect(dsn, autocommit=True) as conn, processes.running(worker, relay):
            wait_until(
                lambda: scalar(conn, "SELECT count(*) FROM greeter.greetings WHERE counted = 1") == 2,
                timeout=60,
                what="both greetings recorded and counted once",
            )
        assert _schemas(dsn) == {"greeter"}
        estafeta_from = run(str(bin_ / "python"), "-c", "import estafeta; print(estafeta.__file__)")
        assert estafeta_from.stdout.startswith(str(venv)), estafeta_from.stdout
