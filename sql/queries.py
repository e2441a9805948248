"""Named queries from ``queries.sql``, parsed once and bound to a service schema.

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
def _parsed() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def names() -> list[str]:
    """Every query name defined in ``queries.sql``."""
    return sorted(_parsed())


@functools.cache
def query(name: str, schema: str) -> sql.Composed:
    """The query ``name`` with ``{schema}`` bound to the service schema ``schema``."""
    try:
        body = _parsed()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in sql/queries.sql") from None
    # Literal braces are not used in queries.sql, so format() only sees {schema}.
    return sql.SQL(body).format(schema=sql.Identifier(schema))
