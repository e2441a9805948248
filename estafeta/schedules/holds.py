"""What a scheduler holds back after a failure: an unreachable database, or a service whose schedules it cannot read.

A worker's scheduler thread serves the schedules of every service of its app, and the
services may live in several databases. An outage of one database must hold back only the
schedules that need it (those of the services it holds, and those whose overlap policy
asks it about their previous run), never the others. :class:`HeldBack` remembers each
failed key (a database's DSN, or a service) with a pause of its own, doubling from
``first`` up to ``longest`` seconds while the key keeps failing; the scheduler asks it
before it touches a key, and tries a held key again, waiting at most :data:`PROBE_WAIT`
seconds for a connection, once its pause is over.
"""

from __future__ import annotations

import logging
import time

import attrs

logger = logging.getLogger("estafeta.schedules.scheduler")

#: Seconds a pass waits for a connection to a database it found unreachable before (rather
#: than the pool's timeout): the other services' schedules wait for that pass.
PROBE_WAIT = 0.5


@attrs.define
class _Hold:
    #: When (``time.monotonic()``) the key may be tried again.
    until: float
    #: The pause that set ``until``; the next failure doubles it.
    pause: float


class HeldBack:
    """Keys (a database's DSN, a service) held back after a failure, each for a pause of its own.

    With ``report``, a key that starts failing is a warning in the log and one that works
    again a line at INFO; the failures in between are at DEBUG (a worker's log is not
    flooded by a database that stays away).
    """

    def __init__(self, *, report: bool = True, first: float = 1.0, longest: float = 30.0) -> None:
        self.report = report
        self.first = first
        self.longest = longest
        self._holds: dict[str, _Hold] = {}

    def holds(self, key: str) -> bool:
        """Whether ``key`` failed and its pause is not over: leave it alone for now."""
        hold = self._holds.get(key)
        return hold is not None and time.monotonic() < hold.until

    def wait(self, key: str) -> float | None:
        """Seconds to wait for a connection for ``key``: :data:`PROBE_WAIT` if failing, else ``None`` (the pool's)."""
        return PROBE_WAIT if key in self._holds else None

    def failed(self, key: str, what: str, error: object) -> None:
        """Hold ``key`` back (again), for twice its last pause; ``what`` it holds back, for the log."""
        hold = self._holds.get(key)
        pause = self.first if hold is None else min(hold.pause * 2, self.longest)
        self._holds[key] = _Hold(until=time.monotonic() + pause, pause=pause)
        if self.report:
            level = logging.WARNING if hold is None else logging.DEBUG
            logger.log(level, "schedules held back %.1fs: %s: %s", pause, what, error)

    def recovered(self, key: str, what: str) -> None:
        """Forget ``key``'s failures."""
        if self._holds.pop(key, None) is not None and self.report:
            logger.info("schedules held back go on: %s", what)

    def seconds_to_retry(self) -> float | None:
        """Seconds until the first held key may be tried again (``None``: none is held)."""
        now = time.monotonic()
        return min((max(h.until - now, 0.0) for h in self._holds.values()), default=None)
