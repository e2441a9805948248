"""Deliveries that die with their process, told apart from deliveries that fail.

Every delivery of a message is counted before its work, in a transaction of its own
(``count_attempt`` in ``sql/queries.sql``), and marked unfinished. It finishes by
committing (the count goes with the inbox record) or, when the step raises, by
:func:`ended_on_error` recording its end once the step's transaction has rolled back. A
delivery that did neither died with its process (SIGKILL, an OOM kill, a segfault): the
next count of the message adds it to the message's deaths. Ordinary failures are retried
up to ``ESTAFETA_MAX_DELIVERIES`` (25 by default); a message whose deliveries died
``ESTAFETA_MAX_WORKER_DEATHS`` times (3 by default) is parked before it kills another
worker (:class:`KilledItsWorker`), so one such message costs three restarts, not 25.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

from estafeta_sql import inbox
from estafeta_sql.errors import DatabaseUnavailable
from estafeta_sql.pool import Database

logger = logging.getLogger(__name__)


class KilledItsWorker(Exception):
    """A message whose deliveries died with their process too often: parked without running again."""

    def __init__(self, deaths: int) -> None:
        super().__init__(f"killed its worker {deaths} time(s)")
        #: Deliveries of the message that died with their process.
        self.deaths = deaths

    @property
    def reason(self) -> str:
        """The dead letter's reason."""
        times = "time" if self.deaths == 1 else "times"
        return (
            f"killed its worker {self.deaths} {times}: its deliveries died with their process"
            " (SIGKILL, out of memory?); parked at ESTAFETA_MAX_WORKER_DEATHS"
        )


def check(deaths: int, limit: int) -> None:
    """Raise :class:`KilledItsWorker` if ``deaths`` reached ``limit`` (``ESTAFETA_MAX_WORKER_DEATHS``)."""
    if deaths >= limit:
        raise KilledItsWorker(deaths)


@contextlib.contextmanager
def ended_on_error(
    database: Database,
    schema: str,
    consumer: str,
    message_id: uuid.UUID,
    *,
    uncounted: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Record that the delivery ended when the block raises (anything but ``uncounted``), then re-raise.

    Enter it before the step's connection, so that the end is written once the step's
    transaction has rolled back. ``uncounted``: exceptions of a delivery that was not
    counted (a suspect sent to run alone), whose end is not its own to record. A database
    that is gone (``DatabaseUnavailable``) takes no end: the delivery, if it was counted,
    counts as a death, one at most per outage, since a count needs the database too.
    """
    try:
        yield
    except uncounted:
        raise
    except DatabaseUnavailable:
        raise
    except BaseException:
        _record_end(database, schema, consumer, message_id)
        raise


def _record_end(database: Database, schema: str, consumer: str, message_id: uuid.UUID) -> None:
    try:
        with database.transaction() as conn:
            inbox.end_attempt(conn, schema, consumer, message_id)
    except Exception as exc:  # the step's own error is what the caller must see
        logger.warning("%s: could not record the end of a delivery of %s (%s)", consumer, message_id, exc)
