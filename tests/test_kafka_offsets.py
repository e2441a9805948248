"""The commit point of a partition whose messages finish out of order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from estafeta_brokers.kafka_offsets import PartitionOffsets


def test_commit_stops_at_the_lowest_unfinished_offset() -> None:
    offsets = PartitionOffsets(0)
    assert offsets.due() is None  # nothing received: nothing to commit
    for offset in range(10, 15):
        offsets.received(offset)
    assert offsets.due() == 10
    offsets.finished(12)
    offsets.finished(13)
    assert offsets.due() == 10  # 10 and 11 still run
    offsets.finished(10)
    assert offsets.due() == 11
    offsets.committed = 11
    assert offsets.due() is None  # nothing new
    offsets.finished(11)
    offsets.finished(14)
    assert offsets.due() == 15 and offsets.in_flight == 0


def test_gaps_in_offsets_are_passed_over() -> None:
    offsets = PartitionOffsets(0)
    for offset in (3, 7, 20):  # compacted topics and transaction markers leave gaps
        offsets.received(offset)
    offsets.finished(3)
    assert offsets.due() == 7
    offsets.finished(20)
    offsets.finished(7)
    assert offsets.due() == 21


@given(st.permutations(list(range(30))), st.integers(min_value=0, max_value=30))
def test_never_past_an_unfinished_offset_and_never_back(order: list[int], unfinished: int) -> None:
    offsets = PartitionOffsets(0)
    for offset in range(30):
        offsets.received(offset)
    finished: set[int] = set()
    for offset in order[: 30 - unfinished]:
        offsets.finished(offset)
        finished.add(offset)
        point = offsets.due()
        if point is None:
            continue
        assert all(o in finished for o in range(point))  # everything below it is done
        assert offsets.committed is None or point > offsets.committed
        offsets.committed = point
    expected = min(set(range(30)) - finished, default=30)
    assert offsets.commit_point() == expected
