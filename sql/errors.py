"""estafeta's exception hierarchy.

Every error estafeta raises on purpose derives from :class:`EstafetaError`; each
class's docstring is its default message. Driver errors (psycopg) are translated
in exactly one place, :func:`estafeta_sql.pool.translate_errors`.
"""

from __future__ import annotations


class EstafetaError(Exception):
    """An estafeta operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class DatabaseError(EstafetaError):
    """The database refused or lost the operation."""


class DatabaseUnavailable(DatabaseError):
    """Could not reach PostgreSQL.

    An outage of the whole database (connection refused or lost, server shutting down,
    out of connections, disk or memory): no work on it can succeed until it is back, so
    a loop over many items pauses instead of blaming the item it was on.
    """


class DatabaseRefused(DatabaseUnavailable):
    """The server answered and refused the connection: its settings, not an outage, are wrong.

    The database does not exist, the role does not exist or may not log in, the password is
    wrong, or the server's access rules turn the client away. The message names the setting
    (when known), the server and the database, and what to do. A long-running process treats
    it as an outage (someone may create the database); a command stops on it with exit code 2.
    """


class StatementFailed(DatabaseError):
    """PostgreSQL refused this operation; the database itself is up.

    The error belongs to the work that raised it (a constraint, bad data, a failing
    statement, trigger or hook, a serialization conflict, a statement timeout): other work
    on the same database may still succeed, so a loop over many items records it on the
    item and goes on.
    """

    #: SQLSTATEs of a refusal that says nothing about the work itself: the same operation,
    #: tried again, may pass (a serialization failure, a deadlock, a statement or lock timeout).
    TRANSIENT_STATES = frozenset({"40001", "40P01", "57014", "55P03"})

    def __init__(self, message: str | None = None, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        #: The SQLSTATE PostgreSQL answered with, when it gave one.
        self.sqlstate = sqlstate

    @property
    def transient(self) -> bool:
        """Whether trying the same operation again may succeed (a conflict or a timeout, not a refusal)."""
        return self.sqlstate in self.TRANSIENT_STATES


class StandbysBehind(DatabaseError):
    """The standbys the relay waits for have not flushed the claimed outbox rows yet.

    Nothing is wrong with the rows: the relay holds them back (and pauses) until enough
    standbys have their commits, so that a failover can never lose a row it published.
    """


class MigrationError(DatabaseError):
    """A migration could not be applied."""


class LockNotAcquired(EstafetaError):
    """The lock could not be acquired in time."""


class StaleFencingToken(EstafetaError):
    """A newer lock holder exists: this write carries an outdated fencing token."""


class ScheduledMessageRefused(EstafetaError):
    """The outbox row cannot be cancelled or rescheduled."""


class MessageAlreadyPublished(ScheduledMessageRefused):
    """The message is not in the outbox: already published (or cancelled, or never sent)."""


class MessageBeingPublished(ScheduledMessageRefused):
    """A relay is publishing the message right now (it holds its outbox row): too late to change it."""
