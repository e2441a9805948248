"""Commands that read an app's tables say "not migrated: run `estafeta migrate`" instead of PostgreSQL's words."""

from __future__ import annotations

import re
from collections.abc import Iterable

import click

from estafeta import Service, StatementFailed

from .context import AppContext

#: SQLSTATEs of a table or schema that does not exist: what an unmigrated database answers.
UNDEFINED = frozenset({"42P01", "3F000"})
_MISSING = re.compile(r'^(?P<where>.*?): (?:relation|schema) "(?P<name>[^"]+)" does not exist')


def not_migrated(schemas: Iterable[str], where: str = "") -> str:
    """The line for ``schemas`` not migrated (on the database ``where`` describes)."""
    names = sorted(set(schemas))
    which = f"the schema {names[0]}" if len(names) == 1 else f"the schemas {', '.join(names)}"
    on = f" on {where}" if where else ""
    verb = "is" if len(names) == 1 else "are"
    return f"{which}{on} {verb} not migrated: run `estafeta migrate` first"


def require_migrated(context: AppContext, services: Iterable[Service] | None = None) -> None:
    """Refuse (exit 1, one line) while a migration of ``services`` (every one of the app's) is pending."""
    chosen = list(context.app.services if services is None else services)
    pending = [name for name, names in context.runtime.migrate(chosen, check=True).items() if names]
    if pending:
        where = {context.runtime.database(name).description for name in pending}
        raise click.ClickException(not_migrated(pending, ", ".join(sorted(where))))


def as_not_migrated(exc: StatementFailed) -> str | None:
    """The "not migrated" line for a statement that met a missing table or schema, else ``None``."""
    if exc.sqlstate not in UNDEFINED:
        return None
    found = _MISSING.match(str(exc))
    if found is None:
        return None
    return not_migrated([found.group("name").partition(".")[0]], found.group("where"))
