"""The relay: drains service outboxes into the broker.

Each batch is one transaction: claim due rows (``FOR UPDATE SKIP LOCKED``, per-key
commit order kept), publish them, delete the ones the broker confirmed, count a failed
attempt on the ones it refused. A relay killed at any instant loses nothing: its locks
die with its connection and unconfirmed or undeleted rows are claimed again (so a row
may be published twice; the consumer's inbox absorbs the copy).

The relay must run in its own process, never inside a Dramatiq worker: declaring a
queue in a worker makes that worker consume it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import timedelta

import attrs
import psycopg
from psycopg import sql

from sql import outbox as store
from sql.errors import DatabaseError
from sql.pool import Database

from .errors import BrokerUnavailable
from .publish import Publisher

logger = logging.getLogger(__name__)


@attrs.frozen
class Outbox:
    """One service's outbox: its schema and the database it lives in."""

    schema: str
    database: Database


@attrs.frozen
class RelayConfig:
    """How the relay paces itself."""

    #: Rows claimed and published per transaction.
    batch_size: int = 500
    #: Seconds between polls when no NOTIFY arrives (the fallback for lost wake-ups).
    poll_interval: float = 1.0
    #: Failed publishes before a row becomes ``failed`` (``estafeta outbox retry`` revives it).
    max_attempts: int = 5
    #: Wait before retrying a refused row: ``attempt_backoff * 2**attempts``, capped at a minute.
    attempt_backoff: timedelta = timedelta(seconds=1)
    #: Longest pause while the broker or the database is unreachable.
    max_outage_backoff: float = 30.0


@attrs.frozen
class BatchResult:
    """What one batch did."""

    claimed: int
    published: int
    failed: int
    broker_error: str | None = None


class Relay:
    """Drains ``outboxes`` through ``publisher``."""

    def __init__(self, outboxes: Sequence[Outbox], publisher: Publisher, config: RelayConfig) -> None:
        self.outboxes = list(outboxes)
        self.publisher = publisher
        self.config = config
        self.wake = threading.Event()

    def relay_batch(self, outbox: Outbox) -> BatchResult:
        """Claim, publish and settle one batch of ``outbox``."""
        with outbox.database.transaction() as conn:
            rows = store.claim_batch(conn, outbox.schema, self.config.batch_size)
            if not rows:
                return BatchResult(0, 0, 0)
            outcome = self.publisher.publish(rows)
            store.delete_published(conn, outbox.schema, outcome.confirmed)
            for row_id, error in outcome.failed.items():
                attempts = next(r.attempts for r in rows if r.id == row_id)
                backoff = min(self.config.attempt_backoff * 2**attempts, timedelta(minutes=1))
                store.record_publish_failure(
                    conn,
                    outbox.schema,
                    [row_id],
                    error,
                    max_attempts=self.config.max_attempts,
                    backoff=backoff,
                )
        result = BatchResult(len(rows), len(outcome.confirmed), len(outcome.failed), outcome.broker_error)
        logger.debug(
            "relay %s: claimed %d, published %d, failed %d",
            outbox.schema,
            result.claimed,
            result.published,
            result.failed,
        )
        if outcome.failed:
            logger.warning("relay %s: %d row(s) refused by the broker", outbox.schema, len(outcome.failed))
        return result

    def drain_once(self) -> int:
        """Publish everything due now in every outbox; return how many rows were published.

        Raises :class:`BrokerUnavailable` if the broker cannot be reached.
        """
        published = 0
        for outbox in self.outboxes:
            while True:
                result = self.relay_batch(outbox)
                published += result.published
                if result.broker_error:
                    raise BrokerUnavailable(result.broker_error)
                if result.claimed < self.config.batch_size or result.published == 0:
                    break
        return published

    def run(self, stop: threading.Event) -> None:
        """Drain until ``stop`` is set, woken by NOTIFY and, failing that, by the poll interval.

        An unreachable broker or database pauses the relay with growing backoff; it never
        gives up and never drops a row.
        """
        listeners = [
            _Listener(dsn, self.wake, stop, self.config.poll_interval)
            for dsn in sorted({o.database.dsn for o in self.outboxes})
        ]
        for listener in listeners:
            listener.start()
        outage = 0.0
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    self.drain_once()
                    outage = 0.0
                except (BrokerUnavailable, DatabaseError) as exc:
                    outage = min(max(outage * 2, 0.5), self.config.max_outage_backoff)
                    logger.warning("relay paused %.1fs: %s", outage, exc)
                    stop.wait(outage)
                    continue
                self.wake.wait(self.config.poll_interval)
        finally:
            self.wake.set()
            for listener in listeners:
                listener.join(timeout=self.config.poll_interval + 5)
            self.publisher.close()


class _Listener(threading.Thread):
    """LISTENs for outbox wake-ups on one database; reconnects by itself when dropped."""

    def __init__(self, dsn: str, wake: threading.Event, stop: threading.Event, interval: float) -> None:
        super().__init__(name="estafeta-relay-listener", daemon=True)
        self.dsn = dsn
        self.wake = wake
        self.stop = stop
        self.interval = interval

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.WAKE_CHANNEL)))
                    # Anything committed before LISTEN took effect was missed: drain once.
                    self.wake.set()
                    while not self.stop.is_set():
                        for _ in conn.notifies(timeout=self.interval, stop_after=1):
                            self.wake.set()
            except psycopg.Error as exc:
                logger.info("relay listener lost its connection (%s); polling until it is back", exc)
                self.stop.wait(self.interval)
