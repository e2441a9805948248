"""An ORM ``Session`` on a step's own transaction: ``estafeta.sqlalchemy.session(ctx)``.

The step owns its transaction (inbox record, lock, work, outbox rows, answer, commit), so
the session borrows the step's psycopg connection instead of taking one from a pool: a
SQLAlchemy engine whose ``creator`` hands over the step's connection behind a thin
wrapper on which ``commit``, ``rollback`` and ``close`` do nothing. The session joins the
transaction in ``rollback_only`` mode: ``session.commit()`` only flushes, and the session's
pending changes are flushed once more when the step's function returns, before the
answer and the commit. A ``session.rollback()`` cannot undo part of the step's
transaction without undoing its inbox record too, so it is remembered and fails the
step (:class:`SessionRolledBack`): the whole transaction rolls back and the message is
retried.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from estafeta.steps.context import StepContext
from estafeta_sql.errors import EstafetaError

_RESOURCE = "estafeta.sqlalchemy.session"
_lending: contextvars.ContextVar[Lent | None] = contextvars.ContextVar("estafeta_sqlalchemy_lending", default=None)


class SessionRolledBack(EstafetaError):
    """The step's session was rolled back: the step's transaction rolls back as a whole, and the message is retried.

    Raise an exception instead (a :class:`estafeta.BusinessFailure` to refuse the command).
    """


class Lent:
    """The step's psycopg connection as the engine's DBAPI connection; the transaction stays the step's."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        #: The step's connection.
        self.conn = conn
        #: Whether SQLAlchemy asked for a rollback since the session was handed out.
        self.rolled_back = False
        self._armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def arm(self) -> None:
        """From now on a rollback is the step's (before, it was the engine's first-connect check)."""
        self._armed = True

    def commit(self) -> None:
        """Nothing: the step commits."""

    def rollback(self) -> None:
        """Remember it: the step fails at its end (its transaction rolls back whole)."""
        if self._armed:
            self.rolled_back = True

    def close(self) -> None:
        """Nothing: the connection goes back to the step's pool with the step."""

    def add_notice_handler(self, handler: Any) -> None:
        """Add ``handler`` once: SQLAlchemy adds its handler at every connect, and this connection outlives them."""
        with contextlib.suppress(ValueError):
            self.conn.remove_notice_handler(handler)
        self.conn.add_notice_handler(handler)


def session(ctx: StepContext) -> Session:
    """The ORM session of this step's transaction (the same one for every call in the step).

    Its writes commit with the step's inbox record and outbox rows, or not at all; pending
    changes are flushed when the step's function returns. Do not commit, roll back or
    close it: the step does (``commit()`` only flushes; ``rollback()`` fails the step).
    """
    found = ctx.resources.get(_RESOURCE)
    if isinstance(found, Session):
        return found
    lent = Lent(ctx.conn)
    token = _lending.set(lent)
    try:
        bind = _engine().connect()
    finally:
        _lending.reset(token)
    bind.begin()  # SQLAlchemy's bookkeeping only: the step's transaction is already open
    lent.arm()
    made = Session(bind=bind, join_transaction_mode="rollback_only")
    ctx.resources[_RESOURCE] = made
    ctx.before_commit(functools.partial(_flush, made, lent))
    return made


def _flush(made: Session, lent: Lent) -> None:
    made.flush()
    if lent.rolled_back:
        raise SessionRolledBack()


@functools.cache
def _engine() -> Engine:
    # One engine per process, never connecting on its own: each connect() borrows the
    # connection of the step asking for a session. NullPool keeps nothing between steps.
    # No native hstore: registering its adapter asks psycopg for type information on the
    # driver connection itself, which this wrapper is not.
    return create_engine(
        "postgresql+psycopg://",
        creator=_borrowed,
        poolclass=NullPool,
        pool_reset_on_return=None,
        use_native_hstore=False,
    )


def _borrowed() -> Lent:
    lent = _lending.get()
    if lent is None:
        raise RuntimeError("estafeta's step engine connects only inside estafeta.sqlalchemy.session(ctx)")
    return lent
