"""A database that does not exist, or a role the server refuses: one line naming the variable, exit code 2."""

from __future__ import annotations

import subprocess
import uuid

from psycopg import conninfo

from ..integration.processes import BIN, ROOT, estafeta, service_env


def _missing_database(database_url: str) -> str:
    return conninfo.make_conninfo(database_url, dbname=f"estafeta_missing_{uuid.uuid4().hex[:8]}", password="hunter2")


def _only_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
    return lines[0]


def test_a_database_that_does_not_exist_is_one_line_naming_the_variable_exit_2(database_url: str) -> None:
    dsn = _missing_database(database_url)
    params = conninfo.conninfo_to_dict(dsn)
    result = estafeta(service_env(dsn, "stub://"), "sagas", "list")
    assert result.returncode == 2, result.stderr
    line = _only_line(result)
    assert line.startswith(f'estafeta: ESTAFETA_DATABASE_URL: database "{params["dbname"]}" does not exist on '), line
    assert f"{params.get('host', 'localhost')}:{params.get('port', '5432')}" in line
    assert "create it" in line and "fix the database in the URL" in line


def test_a_refused_role_is_one_line_naming_the_variable_exit_2(database_url: str) -> None:
    dsn = conninfo.make_conninfo(database_url, user=f"estafeta_nobody_{uuid.uuid4().hex[:8]}", password="hunter2")
    result = estafeta(service_env(dsn, "stub://"), "outbox", "stats")
    assert result.returncode == 2, result.stderr
    line = _only_line(result)
    assert line.startswith("estafeta: ESTAFETA_DATABASE_URL: "), line
    assert "does not exist" in line and "fix the user or password in the URL" in line


def test_a_service_of_its_own_database_is_named_by_its_own_variable(database_url: str) -> None:
    env = {**service_env(database_url, "stub://"), "ESTAFETA_PAYMENTS_DATABASE_URL": _missing_database(database_url)}
    result = estafeta(env, "migrate", "--check", "--service", "payments")
    assert result.returncode == 2, result.stderr
    assert _only_line(result).startswith("estafeta: ESTAFETA_PAYMENTS_DATABASE_URL: database "), result.stderr


def test_a_worker_whose_database_does_not_exist_fails_its_boot_with_that_line(amqp_url: str, database_url: str) -> None:
    env = service_env(_missing_database(database_url), amqp_url)
    result = subprocess.run(
        [str(BIN / "dramatiq"), "examples.welcome", "--processes", "1", "--threads", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("estafeta:")]
    assert len(ours) == 1 and "ESTAFETA_DATABASE_URL: database" in ours[0] and "create it" in ours[0], result.stderr
    assert "ready for action" not in result.stderr
    assert "hunter2" not in result.stderr
