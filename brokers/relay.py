"""The relay: drains service outboxes into the broker.

Each batch is one transaction: claim due rows (``FOR UPDATE SKIP LOCKED``, per-key
commit order kept, see :func:`sql.outbox.claim_batch`), publish them with confirms
outstanding for the whole batch, delete the ones the broker confirmed in one statement,
count a failed attempt on the ones it refused. A relay killed at any instant loses
nothing: its locks die with its connection and unconfirmed or undeleted rows are
claimed again (so a row may be published twice; the consumer's inbox absorbs the copy).

The relay waits on a NOTIFY that every outbox write sends at commit, and polls as the
fallback (a lost notification, a dropped listener, a pooler that cannot LISTEN).

The relay must run in its own process, never inside a Dramatiq worker: declaring a
queue in a worker makes that worker consume it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import attrs
import psycopg
from psycopg import sql

from sql import outbox as store
from sql.errors import DatabaseError
from sql.pool import Database

from . import metrics, tracing
from .errors import BrokerUnavailable
from .publish import Publisher

logger = logging.getLogger(__name__)

#: ``application_name`` of the relay's LISTEN connections (``pg_stat_activity``).
LISTENER_APPLICATION_NAME = "estafeta-relay-listener"


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

    def __init__(
        self, outboxes: Sequence[Outbox], publisher: Publisher, config: RelayConfig, *, system: str = "dramatiq"
    ) -> None:
        self.outboxes = list(outboxes)
        self.publisher = publisher
        self.config = config
        #: ``messaging.system`` of the broker, for the batches' ``send`` spans.
        self.system = system
        #: Set by NOTIFY (and by anyone who wants the relay to look now).
        self.wake = threading.Event()

    def relay_batch(self, outbox: Outbox) -> BatchResult:
        """Claim, publish and settle one batch of ``outbox``."""
        with outbox.database.transaction() as conn:
            rows = store.claim_batch(conn, outbox.schema, self.config.batch_size)
            if not rows:
                return BatchResult(0, 0, 0)
            claimed_at = time.monotonic()
            with tracing.sending(outbox.schema, rows, self.system) as span:
                outcome = self.publisher.publish(rows)
                tracing.sent(span, len(outcome.confirmed), len(outcome.failed), outcome.broker_error)
            confirmed_after = time.monotonic() - claimed_at
            store.delete_published(conn, outbox.schema, outcome.confirmed)
            self._record_failures(conn, outbox, rows, outcome.failed)
        result = BatchResult(len(rows), len(outcome.confirmed), len(outcome.failed), outcome.broker_error)
        self._observe(outbox, rows, outcome.confirmed, confirmed_after, result)
        return result

    def _record_failures(
        self, conn: psycopg.Connection[object], outbox: Outbox, rows: Sequence[store.OutboxRow], failed: dict[int, str]
    ) -> None:
        attempts = {row.id: row.attempts for row in rows}
        for row_id, error in failed.items():
            backoff = min(self.config.attempt_backoff * 2 ** attempts[row_id], timedelta(minutes=1))
            store.record_publish_failure(
                conn, outbox.schema, [row_id], error, max_attempts=self.config.max_attempts, backoff=backoff
            )

    def _observe(
        self,
        outbox: Outbox,
        rows: Sequence[store.OutboxRow],
        confirmed: Sequence[int],
        confirmed_after: float,
        result: BatchResult,
    ) -> None:
        service = outbox.schema
        metrics.PUBLISHED.labels(service).inc(result.published)
        if result.failed:
            metrics.PUBLISH_FAILED.labels(service).inc(result.failed)
            logger.warning("relay %s: the broker refused %d row(s)", service, result.failed)
        if result.broker_error:
            metrics.BROKER_UNAVAILABLE.labels(service).inc()
        latency = metrics.PUBLISH_LATENCY.labels(service)
        done = set(confirmed)
        for row in rows:
            if row.id in done:
                latency.observe(row.age_seconds + confirmed_after)
        logger.debug(
            "relay %s: claimed %d, published %d, failed %d%s",
            service,
            result.claimed,
            result.published,
            result.failed,
            f", broker unavailable: {result.broker_error}" if result.broker_error else "",
        )

    def drain_once(self, stop: threading.Event | None = None) -> int:
        """Publish everything due now in every outbox; return how many rows were published.

        Stops early (between batches, never inside one) when ``stop`` is set. Raises
        :class:`BrokerUnavailable` if the broker cannot be reached.
        """
        published = 0
        for outbox in self.outboxes:
            while stop is None or not stop.is_set():
                result = self.relay_batch(outbox)
                published += result.published
                if result.broker_error:
                    raise BrokerUnavailable(result.broker_error)
                if result.claimed < self.config.batch_size or result.published == 0:
                    break
        return published

    def seconds_until_due(self) -> float | None:
        """Seconds until the next delayed or backing-off row in any outbox becomes due."""
        waits = []
        for outbox in self.outboxes:
            with outbox.database.connection() as conn:
                wait = store.seconds_until_next_due(conn, outbox.schema)
            if wait is not None:
                waits.append(wait)
        return min(waits, default=None)

    def run(self, stop: threading.Event) -> None:
        """Drain until ``stop`` is set, woken by NOTIFY, by a delayed row falling due, or by the poll interval.

        An unreachable broker or database pauses the relay with growing backoff; it never
        gives up and never drops a row. When ``stop`` is set, the batch in hand is
        finished (its rows are deleted or stay pending) and the relay returns.
        """
        listeners = self._start_listeners(stop)
        outage = 0.0
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    self.drain_once(stop)
                    # Woken while draining: go again at once, the NOTIFY may be for rows just missed.
                    wait = 0.0 if self.wake.is_set() else self._idle_wait()
                    outage = 0.0
                except (BrokerUnavailable, DatabaseError) as exc:
                    outage = min(max(outage * 2, 0.5), self.config.max_outage_backoff)
                    logger.warning("relay paused %.1fs: %s", outage, exc)
                    stop.wait(outage)
                    continue
                self.wake.wait(wait)
        finally:
            self.wake.set()
            for listener in listeners:
                listener.join(timeout=self.config.poll_interval + 5)
            self.publisher.close()

    def _start_listeners(self, stop: threading.Event) -> list[threading.Thread]:
        listeners = [
            _Listener(dsn, self.wake, stop, self.config.poll_interval)
            for dsn in sorted({o.database.dsn for o in self.outboxes})
        ]
        for listener in listeners:
            listener.start()
        # A stop must end the wait for a wake-up at once, not after a poll interval.
        threading.Thread(target=self._wake_on, args=(stop,), name="estafeta-relay-stop", daemon=True).start()
        return list(listeners)

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        self.wake.set()

    def _idle_wait(self) -> float:
        due = self.seconds_until_due()
        # A little past the due instant: PostgreSQL's now() is the transaction start.
        return self.config.poll_interval if due is None else min(self.config.poll_interval, due + 0.005)


class _Listener(threading.Thread):
    """LISTENs for outbox wake-ups on one database; reconnects by itself when dropped."""

    def __init__(self, dsn: str, wake: threading.Event, stop: threading.Event, interval: float) -> None:
        super().__init__(name="estafeta-relay-listener", daemon=True)
        self.dsn = dsn
        self.wake = wake
        self.stop = stop
        self.interval = interval

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, application_name=LISTENER_APPLICATION_NAME) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.WAKE_CHANNEL)))
                    failures = 0
                    # Anything committed before LISTEN took effect was missed: drain once.
                    self.wake.set()
                    while not self.stop.is_set():
                        # A short timeout, so that a stopping relay does not wait for a poll interval.
                        for _ in conn.notifies(timeout=min(self.interval, 0.5), stop_after=1):
                            self.wake.set()
            except psycopg.Error as exc:
                failures += 1
                # Reconnect quickly (the poll covers the gap), slower while it keeps failing.
                pause = min(0.05 * 2**failures, self.interval, 5.0)
                logger.info("relay listener lost its connection (%s); polling until it is back", exc)
                self.stop.wait(pause)
