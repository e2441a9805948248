"""Notification ids are global positions, read only up to the high-water mark: a reader never passes a gap.

And the state codec: JSON objects stored as jsonb (readable by SQL), anything else as base64.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.es_interop.support import drop_schema, require_eventsourcing

require_eventsourcing()

from eventsourcing.persistence import StoredEvent  # noqa: E402

from estafeta.events.es_store import data_to_state, state_to_data  # noqa: E402
from estafeta.eventsourcing import EstafetaApplicationRecorder, Factory  # noqa: E402


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    name = f"es_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(database_url, name)


def _recorder(database_url: str, schema: str, timeout: str) -> Iterator[EstafetaApplicationRecorder]:
    factory = Factory(
        {"ESTAFETA_DATABASE_URL": database_url, "ESTAFETA_SCHEMA": schema, "ESTAFETA_NOTIFICATION_TIMEOUT": timeout}
    )
    try:
        yield factory.application_recorder()  # type: ignore[misc]
    finally:
        factory.close()


@pytest.fixture
def recorder(database_url: str, schema: str) -> Iterator[EstafetaApplicationRecorder]:
    """A reader that waits up to 1 s for the log to be final: what it must not return, it returns at once."""
    yield from _recorder(database_url, schema, "1")


@pytest.fixture
def patient(database_url: str, schema: str) -> Iterator[EstafetaApplicationRecorder]:
    """The same log, read waiting up to 60 s: what it must return, it returns once every writer of
    the server older than it has ended (the suite's other tests write beside it)."""
    yield from _recorder(database_url, schema, "60")


def _event(topic: str) -> StoredEvent:
    return StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic=topic, state=b'{"n":1}')


def test_a_reader_stops_below_a_writer_still_open(
    recorder: EstafetaApplicationRecorder, patient: EstafetaApplicationRecorder, database_url: str
) -> None:
    with psycopg.connect(database_url) as held:
        (first,) = recorder.insert_events([_event("first")], conn=held) or []  # drawn, not committed
        (second,) = recorder.insert_events([_event("second")]) or []  # drawn later, committed at once
        assert second > first
        # Reading by position alone would return `second` now, and a follower resuming after
        # it would never see `first`. The recorder holds back everything above the open writer.
        with psycopg.connect(database_url, autocommit=True) as naive:
            visible = [r[0] for r in naive.execute(f"SELECT position FROM {recorder.store.schema}.events")]
        assert visible == [second]
        assert recorder.select_notifications(start=None, limit=10) == []
        assert recorder.max_notification_id() is None
    # the writer committed when its block ended: both, in order
    assert [n.id for n in patient.select_notifications(start=None, limit=10)] == [first, second]
    assert patient.max_notification_id() == second


def test_a_rolled_back_writer_leaves_a_hole_not_a_wait(patient: EstafetaApplicationRecorder, database_url: str) -> None:
    with pytest.raises(RuntimeError), psycopg.connect(database_url) as lost:
        patient.insert_events([_event("lost")], conn=lost)
        raise RuntimeError("roll back")
    (kept,) = patient.insert_events([_event("kept")]) or []
    assert [(n.id, n.topic) for n in patient.select_notifications(start=None, limit=10)] == [(kept, "kept")]
    assert kept == 2  # position 1 went with the rolled-back transaction


@pytest.mark.parametrize(
    "value",
    [{"a": 1, "b": [True, None, "x"], "c": {"d": 1.5}}, {}, {"text": "naïve 🐈"}, {"big": 2**70}],
)
def test_json_objects_are_stored_as_json(value: dict[str, Any]) -> None:
    state = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    data = state_to_data(state)
    assert data == value
    # as PostgreSQL prints the jsonb back (keys reordered, spaces): the same JSON value
    assert json.loads(data_to_state(json.dumps(data, sort_keys=True, indent=1))) == value


@pytest.mark.parametrize(
    "state",
    [
        b"state1",  # not JSON
        b"\x78\x9c\x00\xff",  # compressed, not UTF-8
        b'"a string"',  # JSON, but not an object
        b"[1, 2]",
        b'{"f": 1e+16}',  # jsonb would print 10000000000000000: an int when read back
        b'{"f": -0.0}',  # jsonb has no negative zero
        b'{"f": NaN}',  # not JSON
        b'{"s": "\\u0000"}',  # jsonb refuses NUL
    ],
)
def test_other_states_are_stored_as_base64_and_come_back_byte_for_byte(state: bytes) -> None:
    data = state_to_data(state)
    assert isinstance(data, str)
    assert data_to_state(json.dumps(data)) == state


def _positions_locks(dsn: str, schema: str) -> int:
    """Sessions holding the adapter's positions lock of ``schema`` (see sql/eventsourcing.sql)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('estafeta.eventsourcing:' || %s, 0)",
            (schema,),
        ).fetchone()
        return int(row[0]) if row else 0


def test_the_positions_lock_is_released_when_an_insert_fails(
    recorder: EstafetaApplicationRecorder, database_url: str
) -> None:
    from eventsourcing.persistence import IntegrityError

    event = _event("once")
    recorder.insert_events([event])
    with pytest.raises(IntegrityError):
        recorder.insert_events([_event("fine"), event])  # the duplicate fails the INSERT under the lock
    assert _positions_locks(database_url, recorder.store.schema) == 0
    with psycopg.connect(database_url) as conn:  # inside the caller's transaction, too
        with pytest.raises(IntegrityError):
            recorder.insert_events([event], conn=conn)
        assert _positions_locks(database_url, recorder.store.schema) == 0
        recorder.insert_events([_event("after")], conn=conn)  # the transaction is still usable
    # another session is not kept waiting
    with psycopg.connect(database_url) as other:
        other.execute("SET lock_timeout = '2s'")
        assert recorder.insert_events([_event("other")], conn=other)
