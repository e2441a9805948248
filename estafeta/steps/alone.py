"""A worker process's deliveries run side by side; a suspect runs alone (``estafeta.steps.delivery._beside_or_alone``).

A message whose earlier delivery died unfinished may be the one that kills its process (an
OOM kill, a segfault), or may only have been in flight beside it. Run alone, it cannot be
blamed for another's kill: a kill then counts against the one message in hand. The rest
of the time deliveries share the process, at the cost of one uncontended lock each.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Gate:
    """A readers-writer lock over the deliveries of one process, the writer (a suspect) first.

    :meth:`shared` waits only while a suspect runs or waits to; :meth:`alone` waits until no
    other delivery runs, and keeps new ones out meanwhile. A thread already inside passes
    (a step that delivers a message itself does not wait for itself).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._alone = False
        self._waiting_alone = 0
        self._inside = threading.local()

    @property
    def waiting_alone(self) -> int:
        """Deliveries waiting to run alone."""
        with self._changed:
            return self._waiting_alone

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        if getattr(self._inside, "depth", 0):
            yield
            return
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._running += 1
        try:
            with self._entered():
                yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        if getattr(self._inside, "depth", 0):
            yield
            return
        with self._changed:
            self._waiting_alone += 1
            try:
                self._changed.wait_for(lambda: not self._alone and not self._running)
            finally:
                self._waiting_alone -= 1
            self._alone = True
        try:
            with self._entered():
                yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        self._inside.depth = getattr(self._inside, "depth", 0) + 1
        try:
            yield
        finally:
            self._inside.depth -= 1


#: The gate of this process's deliveries.
DELIVERIES = Gate()
