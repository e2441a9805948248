"""What PostgreSQL itself says about a run: its backends' CPU by connection, what they waited on, its WAL.

:class:`DatabaseWatch` is started before the work and stopped after it. Meanwhile it samples
``pg_stat_activity`` of the run's database every few milliseconds (the wait events of the
active backends: ``Lock:object`` is the database-wide lock every transaction that NOTIFYs
holds from its commit's start to its end, ``IO:WALSync`` a commit's flush). When stopped it
reads each backend's CPU time from ``/proc`` (grouped by ``application_name``; the steps'
pools set none), the WAL written (``pg_current_wal_lsn``), the transaction ids assigned
(each writing transaction takes one) and, from ``pg_stat_wal``, the WAL flushes. The
cumulative statistics reach ``pg_stat_wal`` up to 10 s late from idle backends, so the
flush count is read after ``settle`` seconds of quiet.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import psycopg

from .cpu import process_cpu

#: Seconds an idle backend may keep its statistics before ``pg_stat_wal`` sees them (PGSTAT_IDLE_INTERVAL).
STATS_IDLE_INTERVAL = 10.0

_WAL_AND_XID = """SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_xact_id()::text::bigint,
                         (SELECT wal_sync FROM pg_stat_wal), (SELECT wal_write FROM pg_stat_wal)"""


def _label(application_name: str, backend_type: str) -> str:
    if backend_type != "client backend":
        return backend_type
    name = application_name.split(":")[0]
    return name or "steps' pools (workers, watchdog)"


class DatabaseWatch:
    """Samples what the run's database does; :meth:`stop` returns the figures per unit of work."""

    def __init__(self, dsn: str, interval: float = 0.005) -> None:
        self.dsn = dsn
        self.interval = interval
        self.waits: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-pg-activity", daemon=True)
        self._cpu_before: dict[int, float] = {}
        self._wal_before: tuple[int, int, int, int] = (0, 0, 0, 0)

    def start(self) -> DatabaseWatch:
        """Take the counters' starting values and start sampling."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self._cpu_before = {pid: process_cpu(pid) for pid, _ in self._backends(conn)}
            self._wal_before = self._wal(conn)
        self._thread.start()
        return self

    def stop(self, units: int, settle: float = STATS_IDLE_INTERVAL + 1) -> dict[str, Any]:
        """Stop sampling; every figure is divided by ``units`` (step messages, say)."""
        self._stop.set()
        self._thread.join()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cpu: dict[str, float] = collections.defaultdict(float)
            for pid, label in self._backends(conn):
                cpu[label] += process_cpu(pid) - self._cpu_before.get(pid, 0.0)
            lsn, xid, _, _ = self._wal(conn)
        time.sleep(settle)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            _, _, syncs, writes = self._wal(conn)
        before = self._wal_before
        per = max(units, 1)
        busy = max(self.samples, 1)
        return {
            "units": units,
            "backend_cpu_ms": {k: 1000 * v / per for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0},
            "wal_bytes": (lsn - before[0]) / per,
            "transaction_ids": (xid - before[1]) / per,
            "wal_flushes": (syncs - before[2]) / per,
            "wal_writes": (writes - before[3]) / per,
            # Of all active backends seen, how many were waiting on what (share of samples).
            "waiting": {k: n / busy for k, n in self.waits.most_common(8)},
        }

    def _sample(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            query = """SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU') FROM pg_stat_activity
                       WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()"""
            while not self._stop.wait(self.interval):
                for (wait,) in conn.execute(query).fetchall():
                    self.waits[wait] += 1
                    self.samples += 1

    @staticmethod
    def _backends(conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
        rows = conn.execute(
            """SELECT pid, coalesce(application_name, ''), backend_type FROM pg_stat_activity
               WHERE (datname = current_database() OR datname IS NULL) AND pid <> pg_backend_pid()"""
        ).fetchall()
        return [(int(pid), _label(name, kind)) for pid, name, kind in rows]

    @staticmethod
    def _wal(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int]:
        row = conn.execute(_WAL_AND_XID).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def database_line(figures: dict[str, Any]) -> str:
    """The database's own figures per step, on one line."""
    cpu = ", ".join(f"{name} {ms:.2f}" for name, ms in figures["backend_cpu_ms"].items() if ms >= 0.01)
    waits = ", ".join(f"{name} {share:.0%}" for name, share in figures["waiting"].items())
    return (
        f"PostgreSQL per saga step: {figures['transaction_ids']:.2f} xids, {figures['wal_bytes']:,.0f} WAL bytes,"
        f" {figures['wal_flushes']:.2f} WAL flushes; backend CPU ms: {cpu}; active backends were: {waits}"
    )
