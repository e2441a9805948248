"""estafeta's exception hierarchy.

Every error estafeta raises on purpose derives from :class:`EstafetaError`; each
class's docstring is its default message. Driver errors (psycopg) are translated
in exactly one place, :func:`sql.pool.translate_errors`.
"""

from __future__ import annotations


class EstafetaError(Exception):
    """An estafeta operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class DatabaseError(EstafetaError):
    """The database refused or lost the operation."""


class DatabaseUnavailable(DatabaseError):
    """Could not reach PostgreSQL."""


class MigrationError(DatabaseError):
    """A migration could not be applied."""


class LockNotAcquired(EstafetaError):
    """The lock could not be acquired in time."""


class StaleFencingToken(EstafetaError):
    """A newer lock holder exists: this write carries an outdated fencing token."""
