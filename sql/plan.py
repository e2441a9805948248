"""Database work written once for both psycopg drivers: a plan yields statements, a runner executes them.

A *plan* is a generator: it yields :class:`Statement` objects and receives each one's
:class:`Result` (or the driver's exception, thrown in where the statement was yielded),
and returns its value. :func:`run` executes a plan on a ``psycopg.Connection``,
:func:`run_async` on a ``psycopg.AsyncConnection``: the SQL, the parameters and every
decision between statements are the plan's, so the synchronous API (steps, the CLI, the
relay's callers) and the asynchronous one (``estafeta.aio``, an async web handler) cannot
drift apart. Only what an async caller needs is written as a plan; the runtime stays
synchronous.

Anything else a plan yields is handed to the runner's ``perform`` callback (a transaction
boundary, a call into the caller's code), which answers it.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import JsonbLoader, JsonLoader

T = TypeVar("T")


class Fetch(enum.Enum):
    """What a plan needs back from a statement."""

    #: Nothing: the result is never read (so a pipeline is never synced for it).
    NOTHING = "nothing"
    #: The rows, as tuples.
    ROWS = "rows"
    #: The rows, as dicts keyed by column name.
    DICTS = "dicts"
    #: The number of rows the statement changed.
    ROWCOUNT = "rowcount"


@attrs.frozen
class Statement:
    """One statement of a plan, and what the plan needs back from it."""

    query: sql.SQL | sql.Composed | str | bytes
    params: Mapping[str, Any] | Sequence[Any] | None = None
    fetch: Fetch = Fetch.NOTHING


@attrs.frozen
class Result:
    """What a runner sends back for a statement: its rows (empty unless asked for) and its row count."""

    rows: list[Any] = attrs.field(factory=list)
    rowcount: int = -1

    def first(self) -> Any | None:
        """The first row, or ``None``."""
        return self.rows[0] if self.rows else None


@attrs.frozen
class SyncOnly:
    """A call that needs the synchronous connection itself (a user hook typed on ``psycopg.Connection``).

    :func:`run` calls ``fn(conn)``; :func:`run_async` refuses, naming ``what``.
    """

    fn: Callable[[psycopg.Connection[Any]], object]
    #: What needs it, for the error an async caller gets.
    what: str


class NeedsSyncConnection(TypeError):
    """An asynchronous caller reached work that only runs on a synchronous connection."""


Plan = Generator[Any, Any, T]


def run(conn: psycopg.Connection[Any], plan: Plan[T], perform: Callable[[Any], Any] | None = None) -> T:
    """Execute ``plan`` on ``conn``, inside whatever transaction ``conn`` is in; return the plan's value.

    Statements run on ``conn``, :class:`SyncOnly` calls get ``conn``, anything else goes to ``perform``.
    """

    def on(op: Any) -> Any:
        if isinstance(op, Statement):
            return execute(conn, op)
        if isinstance(op, SyncOnly):
            return op.fn(conn)
        if perform is None:
            raise TypeError(f"a plan yielded {op!r}, which this runner does not perform")
        return perform(op)

    return drive(plan, on)


async def run_async(
    conn: psycopg.AsyncConnection[Any], plan: Plan[T], perform: Callable[[Any], Any] | None = None
) -> T:
    """Execute ``plan`` on the asynchronous ``conn``, as :func:`run` does; :class:`SyncOnly` work is refused.

    ``perform`` may answer with a value or an awaitable.
    """

    async def on(op: Any) -> Any:
        if isinstance(op, Statement):
            return await execute_async(conn, op)
        if isinstance(op, SyncOnly):
            raise NeedsSyncConnection(f"{op.what} runs only on a synchronous connection")
        if perform is None:
            raise TypeError(f"a plan yielded {op!r}, which this runner does not perform")
        answer = perform(op)
        return await answer if inspect.isawaitable(answer) else answer

    return await drive_async(plan, on)


def drive(plan: Plan[T], perform: Callable[[Any], Any]) -> T:
    """Run ``plan``, answering each thing it yields with ``perform(op)``; an exception is thrown into the plan."""
    step: Callable[[Any], Any] = plan.send
    value: Any = None
    while True:
        try:
            op = step(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, step = perform(op), plan.send
        except Exception as exc:  # the plan may translate it, or clean up (roll back) and re-raise
            value, step = exc, plan.throw


async def drive_async(plan: Plan[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`drive` with an asynchronous ``perform``."""
    step: Callable[[Any], Any] = plan.send
    value: Any = None
    while True:
        try:
            op = step(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, step = await perform(op), plan.send
        except Exception as exc:
            value, step = exc, plan.throw


def execute(conn: psycopg.Connection[Any], statement: Statement) -> Result | None:
    """Execute one statement on ``conn``; read back only what it asks for."""
    if statement.fetch is Fetch.NOTHING:
        conn.execute(statement.query, statement.params)
        return None
    factory = dict_row if statement.fetch is Fetch.DICTS else tuple_row
    with conn.cursor(row_factory=factory) as cur:
        json_as_python(cur)
        cur.execute(statement.query, statement.params)
        if statement.fetch is Fetch.ROWCOUNT:
            return Result(rowcount=cur.rowcount)
        return Result(cur.fetchall() if cur.description else [], cur.rowcount)


async def execute_async(conn: psycopg.AsyncConnection[Any], statement: Statement) -> Result | None:
    """:func:`execute` on an asynchronous connection."""
    if statement.fetch is Fetch.NOTHING:
        await conn.execute(statement.query, statement.params)
        return None
    factory = dict_row if statement.fetch is Fetch.DICTS else tuple_row
    async with conn.cursor(row_factory=factory) as cur:
        json_as_python(cur)
        await cur.execute(statement.query, statement.params)
        if statement.fetch is Fetch.ROWCOUNT:
            return Result(rowcount=cur.rowcount)
        return Result(await cur.fetchall() if cur.description else [], cur.rowcount)


def json_as_python(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    # The plans read JSON columns as Python values, psycopg's default; a framework may have
    # changed that on its connections (Django loads jsonb as text, for its JSONField). The
    # cursor's adapters are its own copy: the caller's connection keeps its loaders.
    cursor.adapters.register_loader("jsonb", JsonbLoader)
    cursor.adapters.register_loader("json", JsonLoader)
