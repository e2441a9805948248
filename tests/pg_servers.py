"""Private PostgreSQL servers for tests that kill, promote or cut off a server (never the shared one).

Debian's own binaries (``/usr/lib/postgresql/<version>/bin``), a data directory in a
temporary folder, a free port, trust authentication. PostgreSQL refuses to run as root,
so every server command runs as the ``postgres`` user (``runuser``); a server can also run
inside a network namespace the test made (``netns``), listening on that namespace's
address (``host``). One place knows how: the failover, separate-servers and network fault
tests all start their servers here.

    with private_postgres() as primary:
        standby = primary.standby()          # pg_basebackup -R, synchronous
        primary.kill()                       # SIGKILL the postmaster
        standby.promote()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from .services import free_port, require

_VERSIONS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
PG_BIN = _VERSIONS[-1] if _VERSIONS else Path("/usr/lib/postgresql/15/bin")
_OWNER = "postgres"


class PostgresServer:
    """One private server: its data directory, its port, and the commands that run it."""

    def __init__(self, directory: Path, port: int, *, host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.directory = directory
        self.port = port
        self.host = host
        self.netns = netns
        self.name = directory.name

    # -- addresses ----------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", **options: str | int) -> str:
        """A libpq connection string to this server (``options`` are added as keywords)."""
        words = {"host": self.host, "port": self.port, "user": _OWNER, "dbname": dbname, **options}
        return " ".join(f"{key}={value}" for key, value in words.items())

    def url(self, dbname: str = "postgres") -> str:
        """A ``postgresql://`` URL to this server."""
        return f"postgresql://{_OWNER}@{self.host}:{self.port}/{dbname}"

    # -- commands -----------------------------------------------------------------------

    def _command(self, binary: str, *args: str) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return [*prefix, "runuser", "-u", _OWNER, "--", str(PG_BIN / binary), *args]

    def run(self, binary: str, *args: str, timeout: float = 120) -> str:
        """Run one of PostgreSQL's programs as its owner (in the server's namespace); its output."""
        done = subprocess.run(
            self._command(binary, *args), capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{binary} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def initdb(self, **settings: str | int) -> None:
        """A new cluster in ``directory`` with trust authentication and ``settings`` in its config."""
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.directory, _OWNER, _OWNER)
        self.run("initdb", "-D", str(self.directory), "-A", "trust", "-U", _OWNER, "--no-sync", "-E", "UTF8")
        self.configure(
            listen_addresses=f"'{self.host}'",
            port=self.port,
            unix_socket_directories=f"'{self.directory}'",
            fsync="off",
            full_page_writes="off",
            max_connections=200,
            wal_level="replica",
            max_wal_senders=10,
            wal_keep_size="'256MB'",
            **settings,
        )
        with (self.directory / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n")

    def configure(self, **settings: str | int) -> None:
        """Append ``settings`` to ``postgresql.auto.conf`` (the last one of a name wins)."""
        with (self.directory / "postgresql.auto.conf").open("a") as conf:
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self, timeout: float = 60) -> None:
        """Start the server and wait until it accepts connections."""
        self.run(
            "pg_ctl", "-D", str(self.directory), "-l", str(self.directory / "server.log"),
            "-w", "-t", str(int(timeout)), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate`` is a crash: no checkpoint, no goodbye to clients)."""
        self.run("pg_ctl", "-D", str(self.directory), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends notice and exit; the next start recovers)."""
        pid = self.pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.accepts() and time.monotonic() < deadline:
                time.sleep(0.05)

    def pid(self) -> int | None:
        """The postmaster's pid, or None when the server is not running."""
        try:
            return int((self.directory / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to this server."""
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def accepts(self) -> bool:
        """Whether the server answers a connection now."""
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def promote(self) -> None:
        """Promote this standby to primary (``pg_ctl promote``, waiting until it writes)."""
        self.run("pg_ctl", "-D", str(self.directory), "-w", "promote")

    def standby(
        self, port: int | None = None, *, synchronous: bool = True, host: str | None = None, netns: str | None = None
    ) -> PostgresServer:
        """A streaming standby of this server (``pg_basebackup -R``), started; synchronous by default.

        Synchronous means ``synchronous_standby_names`` on this primary names the standby,
        and ``synchronous_commit = on``: a commit is acknowledged once the standby has it.
        """
        port = port or free_port()
        standby = PostgresServer(
            self.directory.parent / f"{self.name}-standby-{port}",
            port,
            host=host or self.host,
            netns=netns if netns is not None else self.netns,
        )
        standby.directory.mkdir(parents=True)
        shutil.chown(standby.directory, _OWNER, _OWNER)
        standby.directory.chmod(0o700)
        app = standby.name.replace("-", "_")
        standby.run(
            "pg_basebackup", "-h", self.host, "-p", str(self.port), "-U", _OWNER,
            "-D", str(standby.directory), "-R", "-X", "stream", "--no-sync",
            "-d", f"application_name={app}",
        )  # fmt: skip
        standby.configure(
            listen_addresses=f"'{standby.host}'",
            port=standby.port,
            unix_socket_directories=f"'{standby.directory}'",
            primary_conninfo=f"'host={self.host} port={self.port} user={_OWNER} application_name={app}'",
        )
        standby.start()
        if synchronous:
            with psycopg.connect(self.dsn(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{app}'")
                conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
                conn.execute("SELECT pg_reload_conf()")
                deadline = time.monotonic() + 30
                while True:
                    row = conn.execute(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (app,)
                    ).fetchone()
                    if row and row[0] == "sync":
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"standby {app} never became synchronous: {row}")
                    time.sleep(0.05)
        return standby

    def replayed(self, primary: PostgresServer, timeout: float = 60) -> None:
        """Wait until this standby has replayed everything ``primary`` has written so far."""
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        target = row[0] if row else "0/0"
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            while not conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise RuntimeError(f"standby {self.name} did not replay up to {target} in {timeout:.0f} s")
                time.sleep(0.05)

    def stop_streaming(self, timeout: float = 30) -> None:
        """Cut this standby off its primary: it keeps what it has and receives nothing more.

        An empty ``primary_conninfo``, reloaded, stops the WAL receiver (PostgreSQL 13 and later);
        what the primary commits from then on exists on the primary only.
        """
        self.configure(primary_conninfo="''")
        self.run("pg_ctl", "-D", str(self.directory), "reload")
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise RuntimeError(f"standby {self.name} still streams {timeout:.0f} s after the reload")
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the server if it runs (immediately: a test's data is thrown away)."""
        if self.pid() and (self.directory / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.stop("immediate")


def failover_dsn(*servers: PostgresServer, dbname: str = "postgres") -> str:
    """One libpq DSN naming every server (``host=a,b port=pa,pb``): whichever accepts writes now gets the connection."""
    hosts = ",".join(server.host for server in servers)
    ports = ",".join(str(server.port) for server in servers)
    return f"host={hosts} port={ports} user={_OWNER} dbname={dbname} target_session_attrs=read-write"


@contextlib.contextmanager
def private_postgres(
    *, host: str = "127.0.0.1", netns: str | None = None, port: int | None = None, **settings: str | int
) -> Iterator[PostgresServer]:
    """A started private server (and every standby made from it), removed afterwards."""
    require("PostgreSQL (a private server)", (PG_BIN / "initdb").exists(), f"no {PG_BIN / 'initdb'}")
    root = Path(tempfile.mkdtemp(prefix="estafeta-pg-"))
    shutil.chown(root, _OWNER, _OWNER)
    server = PostgresServer(root / "primary", port or free_port(), host=host, netns=netns)
    try:
        server.initdb(**settings)
        server.start()
        yield server
    finally:
        for data in sorted(root.iterdir(), reverse=True):
            PostgresServer(data, 0, netns=netns).close()
        shutil.rmtree(root, ignore_errors=True)
