"""What the nemesis prints when an invariant breaks: the rows, and the faults whose waves they belong to."""

from __future__ import annotations

import collections
import uuid

from .nemesis import Broken, _shared_orders


def test_a_broken_invariant_names_its_rows_and_the_faults_of_their_waves() -> None:
    rows = [{"saga_id": uuid.uuid4(), "status": "failed"} for _ in range(25)]
    waves = collections.Counter({"worker <-> broker (RabbitMQ) cut": 24, "no wave": 1})
    text = str(Broken("every saga final (completed or compensated)", rows, waves))
    first_line = text.splitlines()[0]
    assert first_line.startswith("every saga final (completed or compensated): 25 offending row(s)")
    assert "24 in the wave of 'worker <-> broker (RabbitMQ) cut'; 1 in the wave of 'no wave'" in first_line
    assert str(rows[0]["saga_id"]) in text
    assert "... and 5 more" in text  # 20 rows shown


def test_two_keys_answered_with_one_order_are_offending_rows() -> None:
    shared, other = uuid.uuid4(), uuid.uuid4()
    accepted = {"k1": (shared, 1), "k2": (shared, 3), "k3": (other, 1)}
    assert _shared_orders(accepted) == [f"order {shared}: accepted for keys ['k1', 'k2']"]
