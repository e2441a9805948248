"""A database URL libpq cannot use: one line saying what is wrong with it (the scheme, the port), password masked."""

from __future__ import annotations

import os

import pytest

from ..integration.processes import estafeta


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgress://app:hunter2@db/shop",
            "the scheme 'postgress' of postgress://app:***@db/shop is not postgresql:// (nor postgres://)",
        ),
        ("http://app:hunter2@db:80/shop", "the scheme 'http' of http://app:***@db:80/shop is not postgresql://"),
        ("notaurl", "neither a URL (postgresql://user:password@host:5432/dbname) nor key=value pairs"),
        ("postgresql://app:hunter2@db:54x/shop", "a port of postgresql://app:***@db:54x/shop is not a number"),
        ("postgresql://app:hun/ter@2@db/shop", "a port of postgresql://app:***@db/shop is not a number"),
        ("postgresql://app:hunter2@db:99999/shop", "port 99999 of postgresql://app:***@db:99999/shop is not a TCP"),
        ("host=db port=70000 password='hunter2 x'", "port 70000 of host=db port=70000 password=*** is not a TCP port"),
        ("host=db password=hunter2 x", "a word without '=' among its key=value pairs: quote a value"),
    ],
)
def test_a_malformed_database_url_names_what_is_wrong_without_the_password(url: str, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
    result = estafeta({**env, "ESTAFETA_DATABASE_URL": url}, "sagas", "list")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"estafeta: ESTAFETA_DATABASE_URL: not a PostgreSQL DSN: {expected}"), result.stderr
    assert "hunter2" not in result.stderr and "hun/ter" not in result.stderr
