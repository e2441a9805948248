"""Errors raised by steps, routing and settings (all under :class:`estafeta_sql.errors.EstafetaError`)."""

from __future__ import annotations

from typing import Any

from psycopg.pq import TransactionStatus

from estafeta_sql.errors import EstafetaError


class SettingsError(EstafetaError):
    """A configuration value is invalid."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        #: The environment variable (or TOML key) that holds the bad value.
        self.variable = variable


class BusinessFailure(EstafetaError):
    """The step refused the command for a business reason; retrying will not help.

    Raising it (or a subclass) from a step rolls back the step's own changes but keeps
    the inbox record, so the message is not retried; a saga that sent the command is
    told of the failure and compensates.
    """


class InvalidMessage(EstafetaError):
    """The message cannot be decoded into the step's command class."""


class RoutingError(EstafetaError):
    """No step (or several) handles this command type, or the sender belongs to no app."""


class NoTransaction(EstafetaError):
    """The connection has no transaction open: what estafeta wrote would commit on its own."""


def require_transaction(conn: Any, what: str) -> None:
    """Refuse ``conn`` (a sync or async psycopg connection) in autocommit with no transaction open.

    Such a connection commits each statement by itself: the outbox row would commit alone,
    whatever happens to the caller's writes. A connection out of autocommit opens its
    transaction at the first statement, and one in ``conn.transaction()`` is in it.
    """
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise NoTransaction(
            f"{what} needs a transaction: this connection is in autocommit with none open, so the row would"
            " commit on its own; write it inside `with conn.transaction():` (`async with` on an AsyncConnection)"
        )
