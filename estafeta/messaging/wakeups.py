"""Wake-ups after the commit (``ESTAFETA_WAKEUP=after-commit``): NOTIFYs from a connection of their own.

Under the default (``notify``) every transaction that writes an outbox row or an event
NOTIFYs, and PostgreSQL delivers the notification at commit: it takes a lock on the
notification queue at the commit and holds it until the commit is flushed, so notifying
transactions commit one at a time. Under ``after-commit`` a step's transaction says
``estafeta.wakeup = 'after-commit'`` (``_step_tx.begin``), so its outbox insert and the
events trigger send nothing, and once it has committed the step hands its service's schema
to the :class:`Waker` of its database: one thread per database and process, which sends
the NOTIFYs for every schema handed to it since its last round, in one statement, from its
own autocommit connection. Steps that commit while it sends share the next round.

A wake-up is only ever a hint: relays and projectors poll as well. A worker killed between
a step's commit and the waker's round loses that wake-up; the rows are found at the next
poll (or the next wake-up of the same schema).
"""

from __future__ import annotations

import logging
import threading

import psycopg

from estafeta_sql.outbox import WAKE_CHANNEL

logger = logging.getLogger(__name__)

#: The channel the events trigger NOTIFYs (payload: the schema); see sql/migrations/_events.
EVENTS_CHANNEL = "estafeta_events"
#: ``application_name`` of the waker's connection (``pg_stat_activity``).
APPLICATION_NAME = "estafeta-waker"

_NOTIFY = (
    "SELECT pg_notify(%s, s) FROM unnest(%s::text[]) AS s"
    " UNION ALL SELECT pg_notify(%s, s) FROM unnest(%s::text[]) AS s"
)


class Waker:
    """Sends the wake-ups of committed steps from a connection of its own, coalesced."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        #: Schemas whose relays, and whose projectors, are to be woken.
        self._relays: set[str] = set()
        self._projectors: set[str] = set()
        self._mutex = threading.Lock()
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Rounds sent so far (each one statement for every schema pending).
        self.rounds = 0

    def wake(self, schema: str, *, relays: bool = True) -> None:
        """Wake ``schema``'s relays and projectors soon (call after the commit).

        ``relays=False``: its projectors only (the step's one message is handed off, see
        ``estafeta.messaging.handoff``: its row is leased, so a relay woken now would find nothing due).
        """
        with self._mutex:
            self._projectors.add(schema)
            if relays:
                self._relays.add(schema)
            # Not alive: never started, or this is a child forked after it started.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="estafeta-waker", daemon=True)
                self._thread.start()
        self._ready.set()

    def close(self) -> None:
        """Send what is pending and stop the thread."""
        self._closed.set()
        self._ready.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _take(self) -> tuple[list[str], list[str]]:
        with self._mutex:
            relays, projectors = sorted(self._relays), sorted(self._projectors)
            self._relays, self._projectors = set(), set()
        return relays, projectors

    def _run(self) -> None:
        conn: psycopg.Connection[object] | None = None
        while True:
            self._ready.wait()
            self._ready.clear()
            relays, schemas = self._take()
            if schemas:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, application_name=APPLICATION_NAME)
                        # Nothing to make durable: the commit of a NOTIFY-only transaction.
                        conn.execute("SET synchronous_commit = off")
                    conn.execute(_NOTIFY, (WAKE_CHANNEL, relays, EVENTS_CHANNEL, schemas))
                    self.rounds += 1
                except psycopg.Error as exc:
                    # A hint lost: relays and projectors poll. Reconnect on the next round.
                    logger.info("waker: could not send wake-ups for %s (%s); the poll will find the rows", schemas, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    self._closed.wait(0.5)
            if self._closed.is_set():
                break
        if conn is not None:
            conn.close()
