"""Telling a refused connection (a wrong database, role or password) from an outage, and saying what to do.

libpq reports a server's refusal at connection time as text only (psycopg gives no SQLSTATE
before a connection exists), so the refusal is recognised by PostgreSQL's own messages.
"""

from __future__ import annotations

import getpass
import re
from typing import Any

import psycopg
from psycopg import conninfo

#: PostgreSQL's refusals of a connection, each with the line that says it: ``{reason}`` is
#: PostgreSQL's words, ``{server}``, ``{host}``, ``{port}``, ``{dbname}`` and ``{user}`` the DSN's.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r'database "[^"]*" does not exist'),
        "{reason} on {server}: create it (createdb -h {host} -p {port} {dbname}) or fix the database in the URL",
    ),
    (
        re.compile(
            r'role "[^"]*" does not exist|role "[^"]*" is not permitted to log in'
            r'|(?:password )?authentication failed for user "[^"]*"'
        ),
        '{server} refused user "{user}" for database "{dbname}" ({reason}):'
        " fix the user or password in the URL (or create the role, with LOGIN)",
    ),
    (
        re.compile(r'permission denied for database "[^"]*"'),
        '{server} refused user "{user}" ({reason}): GRANT CONNECT ON DATABASE {dbname} TO {user}, or fix the URL',
    ),
    (
        re.compile(r"no pg_hba\.conf entry for [^,]*"),
        '{server} refused user "{user}" for database "{dbname}" ({reason}):'
        " allow this client in the server's pg_hba.conf, or fix the URL",
    ),
)
_SERVER = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"[^,]*, port (?P<port>\d+)|on socket "(?P<socket>[^"]*)")'
)


def refusal(exc: psycopg.Error, dsn: str) -> str | None:
    """What a user reads when ``exc`` is a server's refusal of a connection to ``dsn``: the server, the
    database, PostgreSQL's reason and what to do, in one line without the password; ``None`` for anything
    else (an outage)."""
    text = str(exc)
    for pattern, line in _REFUSALS:
        found = pattern.search(text)
        if found is None:
            continue
        params = _params(dsn)
        host, port = _server(text, params)
        user = str(params.get("user") or getpass.getuser())
        dbname = str(params.get("dbname") or user)
        server = f"{host}:{port}" if port else host
        return line.format(reason=found.group(0), server=server, host=host, port=port or 5432, dbname=dbname, user=user)
    return None


def _params(dsn: str) -> dict[str, Any]:
    try:
        return conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {}


def _server(text: str, params: dict[str, Any]) -> tuple[str, str]:
    """The host and port libpq says refused (the last one it tried), else the DSN's first."""
    found = list(_SERVER.finditer(text))
    if found:
        last = found[-1]
        if last.group("socket"):
            return last.group("socket"), ""
        return last.group("host"), last.group("port")
    host = str(params.get("host") or "localhost").split(",")[0]
    return host, str(params.get("port") or "5432").split(",")[0]
