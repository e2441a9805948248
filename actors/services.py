"""The services estafeta serves: each owns a PostgreSQL schema of the same name."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib.abc import Traversable

import attrs

from sql import migrate

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_RESERVED = {"public", "information_schema"}


@attrs.frozen
class Service:
    """A service: its name is its schema, its queue and the prefix of its actors' names."""

    name: str
    #: Directories of numbered ``.sql`` migrations, applied after the common messaging tables.
    migration_dirs: tuple[Traversable, ...] = ()

    def migrations(self) -> list[migrate.Migration]:
        """Every migration of this service's schema, in the order they apply."""
        return migrate.load([migrate.builtin_directory("_common"), *self.migration_dirs])


_SERVICES: dict[str, Service] = {}


def declare_service(name: str, migration_dirs: Iterable[Traversable] | None = None) -> Service:
    """Declare (or return the already declared) service ``name``.

    Without ``migration_dirs``, the service's migrations are ``sql/migrations/<name>/``.
    """
    if not _NAME.match(name) or name in _RESERVED or name.startswith("pg_"):
        raise ValueError(f"service name {name!r} must be a lower-case identifier usable as a schema name")
    if name in _SERVICES:
        return _SERVICES[name]
    dirs = tuple(migration_dirs) if migration_dirs is not None else (migrate.builtin_directory(name),)
    service = _SERVICES[name] = Service(name, dirs)
    return service


def get_service(name: str) -> Service:
    """The declared service ``name``."""
    try:
        return _SERVICES[name]
    except KeyError:
        known = ", ".join(sorted(_SERVICES)) or "none"
        raise KeyError(f"no service named {name!r} (declared: {known})") from None


def all_services() -> list[Service]:
    """Every declared service, in declaration order."""
    return list(_SERVICES.values())
