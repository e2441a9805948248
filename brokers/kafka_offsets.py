"""Which offset of a partition a Kafka consumer may commit, when its messages finish out of order.

Dramatiq runs several worker threads: the message at offset 7 can finish before the one
at offset 5. Kafka keeps one committed offset per partition ("everything below this is
done"), so the consumer may commit only up to the lowest offset still in flight. A
worker killed at any moment then loses nothing: its successor starts at that offset and
re-delivers every message from there, the unfinished ones and the finished ones above
them (the receiving step's inbox absorbs those copies).
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    """The offsets of one partition for one assignment of it to this consumer.

    A new object per assignment: a message received under an earlier assignment settles
    nothing once the partition was revoked (its object is gone), so a consumer never
    commits for a partition another member now owns.
    """

    def __init__(self, partition: int) -> None:
        self.partition = partition
        #: Received and not finished (handed to Dramatiq, or still buffered).
        self._in_flight: set[int] = set()
        #: The same offsets as a heap, with finished ones removed lazily.
        self._heap: list[int] = []
        #: One past the highest offset received.
        self._next: int | None = None
        #: The last offset committed by this consumer for this assignment.
        self.committed: int | None = None

    def received(self, offset: int) -> None:
        """``offset`` was fetched: nothing at or above it may be committed until it is finished."""
        self._in_flight.add(offset)
        heapq.heappush(self._heap, offset)
        self._next = offset + 1 if self._next is None else max(self._next, offset + 1)

    def finished(self, offset: int) -> None:
        """``offset`` was acknowledged or dead-lettered."""
        self._in_flight.discard(offset)

    @property
    def in_flight(self) -> int:
        """How many received offsets are not finished."""
        return len(self._in_flight)

    def lowest_in_flight(self) -> int | None:
        """The lowest unfinished offset, if any."""
        while self._heap and self._heap[0] not in self._in_flight:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def commit_point(self) -> int | None:
        """The offset to commit: the lowest unfinished one, or one past the highest received."""
        lowest = self.lowest_in_flight()
        return lowest if lowest is not None else self._next

    def due(self) -> int | None:
        """:meth:`commit_point` if it is past what was committed, else ``None`` (it never moves back)."""
        point = self.commit_point()
        if point is None or (self.committed is not None and point <= self.committed):
            return None
        return point
