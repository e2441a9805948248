"""Every command that reads the tables answers a database not migrated with the line `serve` gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..integration.processes import estafeta, service_env
from ..services import scratch_database

SAGA = "00000000-0000-0000-0000-000000000001"


@pytest.fixture(scope="module")
def empty_database() -> Iterator[str]:
    with scratch_database() as dsn:
        yield dsn


@pytest.mark.parametrize(
    "args",
    [
        ["sagas", "list"],
        ["sagas", "show", SAGA],
        ["outbox", "stats"],
        ["outbox", "retry", "--all"],
        ["dead-letters", "list"],
        ["dead-letters", "groups"],
        ["projections", "status"],
        ["prune"],
        ["ping", "--timeout", "1"],
        ["orders", "list"],
    ],
    ids=" ".join,
)
def test_a_command_on_a_database_not_migrated_says_run_estafeta_migrate(empty_database: str, args: list[str]) -> None:
    result = estafeta(service_env(empty_database, "stub://"), *args)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith("estafeta: the "), result.stderr
    assert "not migrated" in result.stderr and result.stderr.strip().endswith("run `estafeta migrate` first")
    assert "does not exist" not in result.stderr
