"""estafeta as a library: importing it does nothing, apps are explicit, examples touch only their own schemas."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import estafeta
from estafeta.app.middleware import STUB_REFUSAL

from .integration.processes import BIN, ROOT, service_env
from .services import scratch_database

_IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import dramatiq.broker
import estafeta
modules = [info.name for info in pkgutil.walk_packages(estafeta.__path__, prefix="estafeta.")]
for name in modules:
    importlib.import_module(name)
print(json.dumps({
    "modules": modules,
    "broker": repr(dramatiq.broker.global_broker),
    "apps": sorted(
        name for name in sys.modules if name.split(".")[0] in ("estafeta_actors", "estafeta_cli", "examples")
    ),
}))
"""


def test_importing_every_module_of_estafeta_sets_no_broker_and_reads_no_environment() -> None:
    # An environment that would make any settings read fail: importing must not read it.
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "ESTAFETA_BROKER_URL": "bogus://", "ESTAFETA_X": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    import json

    found = json.loads(result.stdout)
    assert "estafeta.app.app" in found["modules"] and "estafeta.steps.delivery" in found["modules"]
    assert found["broker"] == "None"
    assert found["apps"] == []


def test_the_runtime_and_the_async_api_import_no_framework() -> None:
    # The extras stay optional: an app that never imports estafeta.sqlalchemy needs no SQLAlchemy.
    code = (
        "import sys, estafeta, estafeta.aio, estafeta_cli.main, estafeta_actors.app, estafeta_brokers.relay;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'django')))"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_public_api_is_all_documented_and_importable() -> None:
    assert sorted(estafeta.__all__) == sorted(set(estafeta.__all__))
    for name in estafeta.__all__:
        value = getattr(estafeta, name)
        assert (getattr(value, "__doc__", None) or "").strip(), f"estafeta.{name} has no docstring"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


#: Modules under estafeta that apps may import: the eventsourcing library's persistence module,
#: the async producer API, the SQLAlchemy and Django adapters, the pytest plugin.
PUBLIC_SUBMODULES = {
    "estafeta.eventsourcing",
    "estafeta.aio",
    "estafeta.sqlalchemy",
    "estafeta.sqlalchemy.asyncio",
    "estafeta.django",
    "estafeta.testing",
}


@pytest.mark.parametrize("package", ["estafeta_actors", "examples"])
def test_apps_are_built_on_the_public_api_only(package: str) -> None:
    private = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / package).rglob("*.py")
        for module in _imports(path)
        if module.startswith("estafeta.") and module not in PUBLIC_SUBMODULES
    }
    assert private == set()


def _schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' AND nspname <> 'information_schema'"
        ).fetchall()
    return {str(r[0]) for r in rows} - {"public"}


def test_running_an_example_creates_only_its_own_schemas_and_declares_only_its_own_actors() -> None:
    with scratch_database() as dsn:
        env = service_env(dsn, "stub://")
        run = subprocess.run(
            [sys.executable, "-m", "examples.welcome", "--customers", "2", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert _schemas(dsn) == {"customers", "bonus", "mailer"}
        probe = (
            "import sys, dramatiq, examples.welcome\n"
            "print(sorted(dramatiq.get_broker().actors))\n"
            "print(sorted(m for m in sys.modules if m == 'estafeta_actors'))"
        )
        declared = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert declared.returncode == 0, declared.stderr
        actors_line, imported_line = declared.stdout.splitlines()
        assert actors_line == str(["bonus.activate_welcome_bonus", "customers.record_bonus", "mailer.send_welcome"])
        assert imported_line == "[]"


@pytest.mark.heavy
def test_the_cli_runs_on_an_example_app_and_keeps_order_commands_for_the_order_system() -> None:
    with scratch_database() as dsn:
        env = {**service_env(dsn, "stub://"), "ESTAFETA_APP": "examples.welcome"}
        migrated = subprocess.run(
            [str(BIN / "estafeta"), "migrate"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert migrated.returncode == 0, migrated.stderr
        assert [line.split(":")[0] for line in migrated.stdout.splitlines()] == ["customers", "bonus", "mailer"]
        assert _schemas(dsn) == {"customers", "bonus", "mailer"}
        refused = subprocess.run(
            [str(BIN / "estafeta"), "orders", "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2
        assert refused.stderr.strip() == (
            "estafeta orders status: `estafeta orders status` belongs to estafeta's order system"
            " (--app estafeta_actors), not to --app examples.welcome"
        )


def test_the_cli_finds_an_app_module_in_the_current_directory_as_dramatiq_does(tmp_path: Path) -> None:
    (tmp_path / "shopfront.py").write_text(
        "import estafeta\ncarts = estafeta.Service('carts')\napp = estafeta.App('shopfront', services=[carts])\n"
    )
    with scratch_database() as dsn:
        env = service_env(dsn, "stub://")
        env.pop("PYTHONPATH")
        migrated = subprocess.run(
            [str(BIN / "estafeta"), "--app", "shopfront", "migrate"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr
        assert _schemas(dsn) == {"carts"}


def test_a_dramatiq_worker_on_the_stub_broker_stops_at_once_with_one_line(database_url: str) -> None:
    env = service_env(database_url, "stub://")
    result = subprocess.run(
        [str(BIN / "dramatiq"), "examples.welcome", "--processes", "1", "--threads", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("estafeta:")]
    assert lines == [STUB_REFUSAL]


@pytest.mark.heavy
def test_a_relay_and_a_worker_on_the_embedded_database_say_so_and_where(tmp_path: Path, redis_url: str) -> None:
    env = {**service_env("embedded", redis_url + "-embedded"), "ESTAFETA_APP": "examples.welcome"}
    data = tmp_path / ".estafeta" / "pgdata"
    expected = f"uses the embedded PostgreSQL (ESTAFETA_DATABASE_URL=embedded), its data in {data}"
    estafeta_bin = str(BIN / "estafeta")
    migrated = subprocess.run(
        [estafeta_bin, "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert migrated.returncode == 0, migrated.stderr
    relay = subprocess.run(
        [estafeta_bin, "relay", "--once"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert relay.returncode == 0, relay.stderr
    assert relay.stdout.strip() == "published 0"
    notice, starting = relay.stderr.splitlines()
    assert notice == f"estafeta: this relay {expected}: for trying estafeta out, not for production"
    assert starting.startswith("estafeta: relay publishing the outboxes of ") and starting.endswith(", once")
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), "examples.welcome", "--processes", "1", "--threads", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        seen = [next(line for line in worker.stdout if line.startswith("estafeta:")).strip()]
    finally:
        worker.terminate()
        worker.wait(30)
    assert seen == [f"estafeta: this worker {expected}: for trying estafeta out, not for production"]
