"""The relay: drains service outboxes into the broker.

Each batch is one transaction: claim due rows (``FOR UPDATE SKIP LOCKED``, per-key
commit order kept, see :func:`estafeta_sql.outbox.claim_batch`), publish them with confirms
outstanding for the whole batch, delete the ones the broker confirmed in one statement,
count a failed attempt on the ones it refused. A relay killed at any instant loses
nothing: its locks die with its connection and unconfirmed or undeleted rows are
claimed again (so a row may be published twice; the consumer's inbox absorbs the copy).

The relay waits on a NOTIFY that every outbox write sends at commit, and polls as the
fallback (a lost notification, a dropped listener, a pooler that cannot LISTEN). A NOTIFY
names its outbox (the payload is the schema), and the relay drains only the outboxes
named since its last drain; a poll, or a wake-up that names none, drains them all.

The relay must run in its own process, never inside a Dramatiq worker: declaring a
queue in a worker makes that worker consume it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta

import attrs
import psycopg
from psycopg import sql

from estafeta_sql import outbox as store
from estafeta_sql.errors import DatabaseError
from estafeta_sql.pool import notifications

from . import metrics, tracing
from .batches import PublishOutcome
from .deployments import DeploymentName, stamp
from .errors import BrokerUnavailable
from .outboxes import Outbox
from .publish import Publisher

logger = logging.getLogger(__name__)

#: ``application_name`` of the relay's LISTEN connections (``pg_stat_activity``).
LISTENER_APPLICATION_NAME = "estafeta-relay-listener"


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
    #: Standbys that must have flushed a row's commit before it is published (0: publish at
    #: once). With asynchronous replication, a failover then loses rows and their effects,
    #: never a message already sent for them.
    wait_standbys: int = 0
    #: Seconds a batch waits for those standbys before it is put back and the relay pauses.
    standby_timeout: float = 5.0


@attrs.frozen
class BatchResult:
    """What one batch did."""

    claimed: int
    published: int
    failed: int
    broker_error: str | None = None
    #: Rows the broker turned away for now (they back off, never parked).
    deferred: int = 0


class Relay:
    """Drains ``outboxes`` through ``publisher``."""

    def __init__(
        self, outboxes: Sequence[Outbox], publisher: Publisher, config: RelayConfig, *, system: str = "dramatiq"
    ) -> None:
        self.outboxes = list(outboxes)
        self.publisher = publisher
        self.config = config
        #: The deployment named in every message published (``estafeta_brokers.deployments``); ``None``: none.
        self.deployment: DeploymentName | None = None
        #: ``messaging.system`` of the broker, for the batches' ``send`` spans.
        self.system = system
        #: Set by NOTIFY (and by anyone who wants the relay to look now: every outbox, unless
        #: :meth:`notice` named some).
        self.wake = threading.Event()
        #: Outboxes named by the wake-ups since the last drain (empty: all of them).
        self._woken: set[str] = set()
        self._woken_mutex = threading.Lock()
        #: When each outbox's next delayed or backing-off row falls due (``time.monotonic``), as of its last drain.
        self._next_due: dict[str, float] = {}
        #: Outboxes drained since their next due row was last looked up.
        self._due_unknown: set[str] = set()
        #: Set while the relay waits for a wake-up with nothing left to publish.
        self.idle = threading.Event()
        #: Drains so far: each starts the round robin from the next outbox.
        self._turn = 0
        self._listeners: list[_Listener] = []

    def relay_batch(self, outbox: Outbox) -> BatchResult:
        """Claim, publish and settle one batch of ``outbox``.

        Pipelined: the ``BEGIN`` goes with the claim's first statements, and the delete of
        what was published with the ``COMMIT``, so a batch costs two round trips when no key
        has rows to follow its head.
        """
        with outbox.database.connection() as conn, conn.pipeline(), conn.transaction():
            rows = store.claim_batch(conn, outbox.schema, self.config.batch_size)
            if not rows:
                return BatchResult(0, 0, 0)
            if self.config.wait_standbys:
                store.wait_for_standbys(conn, self.config.wait_standbys, self.config.standby_timeout)
            stamp(rows, self.deployment)
            claimed_at = time.monotonic()
            with tracing.sending(outbox.schema, rows, self.system) as span:
                outcome = self.publisher.publish(rows)
                tracing.sent(span, len(outcome.confirmed), len(outcome.failed), outcome.broker_error)
            confirmed_after = time.monotonic() - claimed_at
            store.delete_published(conn, outbox.schema, outcome.confirmed)
            self._record_failures(conn, outbox, rows, outcome.failed, parks=True)
            self._record_failures(conn, outbox, rows, outcome.deferred, parks=False)
        result = BatchResult(
            len(rows), len(outcome.confirmed), len(outcome.failed), outcome.broker_error, len(outcome.deferred)
        )
        self._observe(outbox, rows, outcome, confirmed_after, result)
        return result

    def _record_failures(
        self,
        conn: psycopg.Connection[object],
        outbox: Outbox,
        rows: Sequence[store.OutboxRow],
        failed: dict[int, str],
        *,
        parks: bool,
    ) -> None:
        """Count an attempt for each of ``failed`` and back it off; park it at the limit if ``parks``."""
        if not failed:
            return
        attempts = {row.id: row.attempts for row in rows}
        for row_id, error in failed.items():
            backoff = min(self.config.attempt_backoff * 2 ** attempts[row_id], timedelta(minutes=1))
            store.record_publish_failure(
                conn,
                outbox.schema,
                [row_id],
                error,
                max_attempts=self.config.max_attempts if parks else None,
                backoff=backoff,
            )

    def _observe(
        self,
        outbox: Outbox,
        rows: Sequence[store.OutboxRow],
        outcome: PublishOutcome,
        confirmed_after: float,
        result: BatchResult,
    ) -> None:
        service = outbox.schema
        metrics.PUBLISHED.labels(service).inc(result.published)
        if result.failed or result.deferred:
            metrics.PUBLISH_FAILED.labels(service).inc(result.failed + result.deferred)
        if result.failed:
            logger.warning(
                "relay %s: the broker refused %d row(s): %s", service, result.failed, _reasons(outcome.failed)
            )
        if result.deferred:
            logger.warning(
                "relay %s: the broker turned away %d row(s) for now: %s",
                service,
                result.deferred,
                _reasons(outcome.deferred),
            )
        if result.broker_error:
            metrics.BROKER_UNAVAILABLE.labels(service).inc()
        latency = metrics.PUBLISH_LATENCY.labels(service)
        done = set(outcome.confirmed)
        for row in rows:
            if row.id in done:
                latency.observe(row.age_seconds + confirmed_after)
        # A batch with rows is worth a line at -v; an empty poll only at -vv.
        logger.log(
            logging.INFO if result.claimed else logging.DEBUG,
            "relay %s: claimed %d, published %d, failed %d%s",
            service,
            result.claimed,
            result.published,
            result.failed,
            f", broker unavailable: {result.broker_error}" if result.broker_error else "",
        )

    def notice(self, schema: str | None) -> None:
        """Wake the relay for ``schema``'s outbox (``None``: every outbox)."""
        with self._woken_mutex:
            self._woken.add(schema or "")
        self.wake.set()

    def _take_woken(self) -> set[str] | None:
        """The outboxes to drain now: those named since the last drain, or ``None`` for all."""
        with self._woken_mutex:
            woken, self._woken = self._woken, set()
        return None if not woken or "" in woken else woken

    def drain_once(self, stop: threading.Event | None = None, only: Collection[str] | None = None) -> int:
        """Publish everything due now in every outbox (or those named in ``only``); return how many rows were published.

        Fair across outboxes: one batch per outbox in turn (round robin) while any of
        them has more, starting from a different outbox each call, so a flood on one
        service delays another's rows by at most one batch per outbox. Stops early
        (between batches, never inside one) when ``stop`` is set. Raises
        :class:`BrokerUnavailable` if the broker cannot be reached.
        """
        published = 0
        outboxes = [o for o in self.outboxes if only is None or o.schema in only]
        start = self._turn % max(len(outboxes), 1)
        self._turn += 1
        busy = outboxes[start:] + outboxes[:start]
        while busy and (stop is None or not stop.is_set()):
            for outbox in list(busy):
                if stop is not None and stop.is_set():
                    break
                result = self.relay_batch(outbox)
                published += result.published
                if result.broker_error:
                    raise BrokerUnavailable(result.broker_error)
                if result.claimed < self.config.batch_size or result.published == 0:
                    busy.remove(outbox)
        return published

    def run(self, stop: threading.Event) -> None:
        """Drain until ``stop`` is set, woken by NOTIFY, by a delayed row falling due, or by the poll interval.

        An unreachable broker or database pauses the relay with growing backoff; it never
        gives up and never drops a row. Any other error is logged with its traceback and
        treated the same way: the batch it hit rolled back (its rows are claimed again),
        the relay backs off and carries on. Only ``stop`` ends it: when it is set, the
        batch in hand is finished (its rows are deleted or stay pending) and it returns.
        """
        listeners = self._start_listeners(stop)
        outage = 0.0
        try:
            while not stop.is_set():
                self.wake.clear()
                only = self._take_woken()
                try:
                    if only is None:  # a poll, or a wake-up naming no outbox: ask them all first
                        only = self._due_outboxes()
                    self.drain_once(stop, only)
                    self._due_unknown.update(only)
                    # Woken while draining: go again at once, the NOTIFY may be for rows just missed.
                    wait = 0.0 if self.wake.is_set() else self._idle_wait()
                    outage = 0.0
                except Exception as exc:
                    outage = min(max(outage * 2, 0.5), self.config.max_outage_backoff)
                    if isinstance(exc, BrokerUnavailable | DatabaseError):
                        logger.warning("relay paused %.1fs: %s", outage, exc)
                    else:
                        logger.exception("relay paused %.1fs by an unexpected error", outage)
                    stop.wait(outage)
                    continue
                self.idle.set()
                self.wake.wait(wait)
                self.idle.clear()
        finally:
            self.wake.set()
            for listener in listeners:
                listener.join(timeout=self.config.poll_interval + 5)
            self.publisher.close()

    @property
    def listening(self) -> bool:
        """Whether every database's listener is connected and has asked for the drain that follows (running relays)."""
        return bool(self._listeners) and all(listener.listening.is_set() for listener in self._listeners)

    def _start_listeners(self, stop: threading.Event) -> list[threading.Thread]:
        listeners = [
            _Listener(dsn, self.notice, stop, self.config.poll_interval)
            for dsn in sorted({o.database.dsn for o in self.outboxes})
        ]
        self._listeners = listeners
        for listener in listeners:
            listener.start()
        # A stop must end the wait for a wake-up at once, not after a poll interval.
        threading.Thread(target=self._wake_on, args=(stop,), name="estafeta-relay-stop", daemon=True).start()
        return list(listeners)

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        self.wake.set()

    def _due_outboxes(self) -> set[str]:
        """The outboxes with a row due now, asked of each database in one round trip (``estafeta_sql.outbox.due_now``).

        A poll used to claim from every outbox in turn, a transaction each, most of them
        finding nothing (with hand-offs, nearly every outbox). The others' next due row,
        learnt by the same statement, is kept for :meth:`_idle_wait`.
        """
        by_database: dict[int, list[Outbox]] = {}
        for outbox in self.outboxes:
            by_database.setdefault(id(outbox.database), []).append(outbox)
        due = set()
        now = time.monotonic()
        for outboxes in by_database.values():
            with outboxes[0].database.connection() as conn:
                found = store.due_now(conn, [o.schema for o in outboxes])
            for schema, seen in found.items():
                if seen.now:
                    due.add(schema)
                    continue
                self._due_unknown.discard(schema)
                if seen.next_in is None:
                    self._next_due.pop(schema, None)
                else:
                    self._next_due[schema] = now + seen.next_in
        return due

    def _idle_wait(self) -> float:
        """Seconds to wait for a wake-up: the poll interval, or less if a delayed row falls due sooner."""
        now = time.monotonic()
        # Only the outboxes drained since the last look can have a new next due row: any
        # other write to an outbox NOTIFYs, and the outbox is drained before the relay idles.
        for outbox in self.outboxes:
            if outbox.schema not in self._due_unknown:
                continue
            with outbox.database.connection() as conn:
                wait = store.seconds_until_next_due(conn, outbox.schema)
            if wait is None:
                self._next_due.pop(outbox.schema, None)
            else:
                self._next_due[outbox.schema] = now + wait
        self._due_unknown.clear()
        if not self._next_due:
            return self.config.poll_interval
        due = min(self._next_due.values()) - time.monotonic()
        # A little past the due instant: PostgreSQL's now() is the transaction start.
        return min(self.config.poll_interval, max(due, 0.0) + 0.005)


class _Listener(threading.Thread):
    """LISTENs for outbox wake-ups on one database; reconnects by itself when dropped."""

    def __init__(self, dsn: str, notice: Callable[[str | None], None], stop: threading.Event, interval: float) -> None:
        super().__init__(name="estafeta-relay-listener", daemon=True)
        self.dsn = dsn
        self.notice = notice
        self.stop = stop
        self.interval = interval
        #: Set once LISTEN took effect and the drain for what came before it was asked for.
        self.listening = threading.Event()

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, application_name=LISTENER_APPLICATION_NAME) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.WAKE_CHANNEL)))
                    failures = 0
                    # Anything committed before LISTEN took effect was missed: drain every outbox once.
                    self.notice(None)
                    self.listening.set()
                    while not self.stop.is_set():
                        # A short timeout, so that a stopping relay does not wait for a poll interval.
                        for note in notifications(conn, min(self.interval, 0.5)):
                            self.notice(note.payload or None)
            except Exception as exc:
                self.listening.clear()
                failures += 1
                # Reconnect quickly (the poll covers the gap), slower while it keeps failing.
                pause = min(0.05 * 2**failures, self.interval, 5.0)
                if isinstance(exc, psycopg.Error):
                    logger.info("relay listener lost its connection (%s); polling until it is back", exc)
                else:  # never let the listener thread die: the relay would only poll from then on
                    logger.exception("relay listener stopped by an unexpected error; polling until it is back")
                self.stop.wait(pause)


def _reasons(why: dict[int, str]) -> str:
    """The distinct reasons in ``why``, the first three."""
    reasons = sorted(set(why.values()))
    return "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
