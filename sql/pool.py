"""Connection pools per database, transactions, and the one place driver errors are translated."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import select
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import psycopg.errors
from psycopg import conninfo, pq
from psycopg_pool import ConnectionPool, PoolTimeout

from . import dsn_shape
from .errors import DatabaseRefused, DatabaseUnavailable, LockNotAcquired, StatementFailed
from .liveness import server_settings, with_liveness
from .refusals import refusal

logger = logging.getLogger(__name__)

#: A transaction left idle this long is a bug (a step blocked on the network while
#: holding locks); PostgreSQL ends it rather than let it hold row locks forever.
IDLE_IN_TRANSACTION_TIMEOUT = "60s"


def describe_dsn(dsn: str) -> str:
    """A DSN as it may appear in logs and errors: hosts, ports, database and user, never the password.

    A DSN naming several hosts (libpq's ``host=a,b port=5432,5433``) is shown with each host
    beside its own port: ``postgresql://app@a:5432,b:5433/shop``.
    """
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    user = params.get("user")
    where = ",".join(f"{host}:{port}" if port else host for host, port in _hosts(params))
    who = f"{user}@" if user else ""
    return f"postgresql://{who}{where}/{params.get('dbname', '')}"


def _hosts(params: dict[str, Any]) -> list[tuple[str, str]]:
    """Each (host, port) a DSN names, in libpq's order (one port applies to every host)."""
    hosts = [h.strip() or "localhost" for h in str(params.get("host") or params.get("hostaddr") or "").split(",")]
    ports = [p.strip() for p in str(params.get("port") or "").split(",")]
    if len(ports) == 1:
        ports = ports * len(hosts)
    return list(zip(hosts, ports, strict=False))


#: ``target_session_attrs`` that only ever connect to a server that accepts writes.
_WRITABLE_ONLY = frozenset({"read-write", "primary"})


def check_dsn(dsn: str) -> None:
    """Raise ``ValueError`` with a reason (that omits the password) if ``dsn`` is not a libpq DSN.

    A DSN naming several hosts (a primary and its standbys) must say
    ``target_session_attrs=read-write`` (or ``primary``): without it libpq connects to the
    first host that answers, a read-only standby as readily as the primary, and every
    step's write there would fail.
    """
    wrong = dsn_shape.shape_error(dsn)
    if wrong:
        raise ValueError(wrong)
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        reason = dsn_shape.parse_error(_scrub(str(exc).strip()))
        raise ValueError(reason or "not a PostgreSQL connection string") from None
    ports = str(params.get("port") or "5432").split(",")
    for port in ports:
        wrong = dsn_shape.port_error(port, dsn)
        if wrong:
            raise ValueError(wrong)
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    if len(hosts) > 1:
        if len(ports) not in (1, len(hosts)):
            raise ValueError(f"{len(ports)} ports for {len(hosts)} hosts: give one port, or one per host")
        attrs = params.get("target_session_attrs") or os.environ.get("PGTARGETSESSIONATTRS") or "any"
        if attrs not in _WRITABLE_ONLY:
            raise ValueError(
                f"names {len(hosts)} hosts but target_session_attrs={attrs}: a connection could land on a"
                " read-only standby; add target_session_attrs=read-write"
            )


def _scrub(message: str) -> str:
    # libpq quotes the offending fragment, which may be (part of) the password: keep only
    # quoted words that are connection keywords ("port", "sslmode"...).
    keywords = {opt.keyword.decode() for opt in pq.Conninfo.get_defaults()}
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if m.group(1) in keywords else '"…"', message)


#: SQLSTATEs (or their two-character classes) that mean the server, not the statement, is the
#: problem: connection exceptions, insufficient resources (disk, memory, connections), the
#: server shutting down or not accepting connections yet, system (I/O) errors.
_OUTAGE_STATES = frozenset({"08", "53", "58", "57P01", "57P02", "57P03", "57P05"})


def is_outage(exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the database is unreachable, rather than that it refused one operation.

    A client-side error without a SQLSTATE (connection refused, lost, closed) is an outage.
    """
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in _OUTAGE_STATES or state[:2] in _OUTAGE_STATES


@contextlib.contextmanager
def translate_errors(where: str, *, dsn: str | None = None, setting: str | None = None) -> Iterator[None]:
    """Turn psycopg and pool errors into estafeta's, naming ``where`` (a DSN description).

    An outage becomes :class:`DatabaseUnavailable`; anything else the database refused
    becomes :class:`StatementFailed`: the one place where the two are told apart. Around a
    connection attempt to ``dsn``, a server that refuses it (no such database or role, a
    wrong password) becomes :class:`DatabaseRefused`, naming ``setting`` (the variable that
    holds ``dsn``) when given.
    """
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
        raise LockNotAcquired(f"lock not acquired in time on {where}: {exc.diag.message_primary}") from exc
    except PoolTimeout as exc:
        raise DatabaseUnavailable(f"no connection to {where} within the pool timeout") from exc
    except psycopg.Error as exc:
        refused = refusal(exc, dsn) if dsn is not None else None
        if refused is not None:
            raise DatabaseRefused(f"{setting or where}: {refused}") from exc
        if is_outage(exc):
            raise DatabaseUnavailable(f"lost or could not open a connection to {where}: {_first_line(exc)}") from exc
        raise StatementFailed(f"{where}: {_first_line(exc)}", sqlstate=exc.sqlstate) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _configure(conn: psycopg.Connection[Any], extra: Mapping[str, str] | None = None) -> None:
    settings = {"idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT}
    settings.update(server_settings(conn.info.server_version))
    settings.update(extra or {})
    conn.execute(
        "SELECT set_config(name, value, false) FROM unnest(%s::text[], %s::text[]) AS s(name, value)",
        (list(settings), list(settings.values())),
    )


class Database:
    """A pool of autocommit connections to one PostgreSQL database.

    ``transaction()`` is the unit of work: everything done on the connection it yields
    commits together when the block ends, or rolls back if it raises.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        connect_first: bool = False,
        session_settings: Mapping[str, str] | None = None,
        check_before_use: bool = False,
        setting: str | None = None,
    ) -> None:
        """``session_settings``: server settings (``set_config``) of every connection, on top of estafeta's own.

        ``check_before_use``: see :attr:`check_before_use`. ``setting``: the variable ``dsn`` came
        from, named when the server refuses it.
        """
        #: What every connection to this database uses: ``dsn`` with estafeta's timeouts
        #: for a silent network (:mod:`estafeta_sql.liveness`) where it sets none of its own.
        self.dsn = with_liveness(dsn)
        self.description = describe_dsn(dsn)
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            kwargs={"autocommit": True},
            configure=functools.partial(_configure, extra=dict(session_settings or {})),
            check=self._check_before_lending,
            name=self.description,
        )
        #: Whether the pool checks each connection (an empty query, one round trip) before it
        #: lends it: a connection the server closed while it sat idle (a restart, a failover,
        #: ``pg_terminate_backend``) is replaced there, and no caller gets it. Worth its round
        #: trip where a lost connection is an error someone sees (a web request); may be
        #: switched on after the pool is made.
        self.check_before_use = check_before_use
        self._opened = False
        self._checking = threading.Lock()
        #: Whether the first use opens one connection in the caller's thread before the pool
        #: starts: a server that refuses (or a wrong host, database or password) is reported at
        #: once with its reason, instead of after the pool's timeout of background retries.
        self._connect_first = connect_first
        self._setting = setting

    def _check_before_lending(self, conn: psycopg.Connection[Any]) -> None:
        # Raising makes the pool discard the connection and lend another (a new one if need be).
        if self.check_before_use:
            ConnectionPool.check_connection(conn)

    def _open(self) -> None:
        if not self._opened:
            if self._connect_first:
                # Once: a later use waits for the pool as any other (an outage is retried there).
                self._connect_first = False
                self.check_connect()
            with translate_errors(self.description):
                self.pool.open(wait=False)
            self._opened = True

    def check_connect(self) -> None:
        """Open and close one connection outside the pool: raise :class:`DatabaseRefused` (naming the
        variable the DSN came from) if the server refuses it, :class:`DatabaseUnavailable` if it is out."""
        with translate_errors(self.description, dsn=self.dsn, setting=self._setting):
            psycopg.connect(self.dsn, autocommit=True).close()

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode; waiting at most ``timeout`` seconds (the pool's) for one.

        A connection lost under its user (the server crashed, restarted or failed over) makes the
        pool check its idle connections at once: they are as likely dead, and the next users
        get new ones instead of finding out one failure per pooled connection.
        """
        self._open()
        try:
            with translate_errors(self.description), self.pool.connection(timeout=timeout) as conn:
                yield conn
        except DatabaseUnavailable as exc:
            if not isinstance(exc.__cause__, PoolTimeout):
                self._check_idle()
            raise

    def _check_idle(self) -> None:
        # In a thread of its own: on a server that vanished without closing its sockets a
        # check waits for the network to give up, and the caller has its error to report now.
        if self._checking.acquire(blocking=False):

            def check() -> None:
                try:
                    self.pool.check()
                except Exception:  # a pool closed meanwhile: nothing left to check
                    logger.debug("checking the idle connections of %s failed", self.description, exc_info=True)
                finally:
                    self._checking.release()

            threading.Thread(target=check, name="estafeta-pool-check", daemon=True).start()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside a transaction that commits when the block ends."""
        with self.connection() as conn, translate_errors(self.description), conn.transaction():
            yield conn

    def close(self) -> None:
        """Close every pooled connection."""
        if self._opened:
            self.pool.close()
            self._opened = False


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """One connection outside any pool (LISTEN, migrations, tests), with :mod:`estafeta_sql.liveness`'s timeouts."""
    with translate_errors(describe_dsn(dsn), dsn=dsn):
        return psycopg.connect(with_liveness(dsn), autocommit=autocommit)


def notifications(conn: psycopg.Connection[Any], timeout: float) -> list[psycopg.Notify]:
    """The notifications a ``LISTEN``ing ``conn`` (doing nothing else) receives within ``timeout`` seconds.

    Returns as soon as some arrive, with all that have; an empty list after ``timeout``. It
    waits in ``select()``, whose timeout is a float, then takes what came without waiting:
    psycopg's own timed wait (``notifies(timeout=...)``, 3.3.9, every wait function but
    ``wait_select``) turns the time left into whole milliseconds, rounding down, and spins
    through the last one, about 1 ms of CPU per wait (20 ms a second for a listener that
    wakes every 50 ms). A closed connection raises, as ``notifies`` would.
    """
    ready, _, _ = select.select([conn.fileno()], [], [], timeout)
    # Also what psycopg received while running something else (its backlog), if nothing came.
    got = list(conn.notifies(timeout=0))
    if ready and not got:
        # Not a notification: a server closing the connection sends its reason first, and
        # only the next read finds the connection gone (or a message came in part).
        got = list(conn.notifies(timeout=0))
    return got
