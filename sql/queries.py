"""Named queries from the ``.sql`` files beside this module, parsed once and bound to a service schema.

The schema name is substituted with :class:`psycopg.sql.Identifier`, so a service
name can never become SQL text.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


@functools.cache
def parse(filename: str) -> dict[str, str]:
    """The named queries of ``sql/<filename>``: each body under its ``-- name --`` header."""
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: _without_comments(body) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _without_comments(body: str) -> str:
    # Whole-line comments are for readers of the file, not bytes for every execution.
    return "\n".join(line for line in body.strip().splitlines() if not line.lstrip().startswith("--"))


def body(filename: str, name: str) -> str:
    """The text of query ``name`` in ``sql/<filename>``."""
    try:
        return parse(filename)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in sql/{filename}") from None


def names() -> list[str]:
    """Every query name defined in ``queries.sql``."""
    return sorted(parse("queries.sql"))


@functools.cache
def query(name: str, schema: str, filename: str = "queries.sql") -> bytes:
    """The query ``name`` of ``sql/<filename>`` with ``{schema}`` bound to the service schema ``schema``."""
    text = body(filename, name)
    # Literal braces are not used in these files, so format() only sees {schema}.
    return rendered(sql.SQL(text).format(schema=sql.Identifier(schema)))


def rendered(statement: sql.Composable) -> bytes:
    """``statement`` as the bytes psycopg would send, for a cache of statements run again and again.

    psycopg renders a :class:`~psycopg.sql.Composed` again at every execution (each identifier
    escaped anew): 4-5 µs a statement. Rendered without a connection, identifiers are quoted in
    Python and the text encoded as UTF-8. The named queries and service names
    (``[a-z][a-z0-9_]*``) are ASCII, the same bytes in any client encoding; a saga's key
    column is named after a Python identifier, which outside ASCII needs a UTF-8 client.
    """
    return statement.as_bytes(None)
