"""Writer processes of ``bench.events``: estafeta's appends and the eventsourcing recorder's inserts, timed alike.

Each writer connects, waits at a barrier for the others, then writes for a fixed time: one
transaction per append of ``batch`` events to one of its own 100 streams, with the exact
expected version (no conflicts: a writer never shares a stream). The event is the same
small JSON object for both stores.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import time
import uuid
from typing import Any

import attrs
import psycopg

from estafeta.events.event_types import EventRegistry
from estafeta.events.store import EventStore

registry = EventRegistry()

#: Streams per writer.
STREAMS = 100


@registry.event("ItemAdded")
@attrs.frozen
class ItemAdded:
    """The benchmark's event: a line added to a cart."""

    sku: str
    quantity: int


PAYLOAD = b'{"sku": "sku-42", "quantity": 3}'


def estafeta_writer(dsn: str, schema: str, batch: int, seconds: float, start: Any, index: int) -> int:
    """Append for ``seconds`` after ``start`` is set; the events committed."""
    store = EventStore(schema, registry)
    versions = [0] * STREAMS
    prefix = f"cart-{index}-{uuid.uuid4().hex[:8]}"  # streams of this writer process alone
    events = [ItemAdded("sku-42", 3)] * batch
    done = 0
    with psycopg.connect(dsn) as conn:
        start.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            stream = done // batch % STREAMS
            store.append(conn, f"{prefix}-{stream}", events, expected_version=versions[stream])
            conn.commit()
            versions[stream] += batch
            done += batch
    return done


def eventsourcing_writer(settings: dict[str, Any], batch: int, seconds: float, start: Any, index: int) -> int:
    """The same with eventsourcing's ``PostgresApplicationRecorder.insert_events`` (one transaction each)."""
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    datastore = PostgresDatastore(**settings)
    done = recorder_writes(PostgresApplicationRecorder(datastore), batch, seconds, start)
    datastore.close()
    return done


def recorder_writes(recorder: Any, batch: int, seconds: float, start: Any) -> int:
    """``recorder.insert_events`` of ``batch`` events, round robin over the streams, for ``seconds`` after ``start``."""
    from eventsourcing.persistence import StoredEvent

    originators = [uuid.uuid4() for _ in range(STREAMS)]
    versions = [1] * STREAMS
    done = 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stream = done // batch % STREAMS
        first = versions[stream]
        recorder.insert_events(
            [StoredEvent(originators[stream], first + i, "bench:ItemAdded", PAYLOAD) for i in range(batch)]
        )
        versions[stream] += batch
        done += batch
    return done


def _run(target: Any, args: tuple[Any, ...], queue: Any) -> None:
    queue.put(target(*args))


def _result(queue: Any, processes: list[Any]) -> int:
    """The next writer's count; raise at once if a writer died instead of waiting for it."""
    while True:
        try:
            return int(queue.get(timeout=1.0))
        except Exception:  # queue.Empty: see whether someone died
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a writer process failed (exit code {failed[0]})") from None


def timed_writers(target: Any, args: tuple[Any, ...], writers: int) -> float:
    """Run ``writers`` processes of ``target(*args, start, index)`` at once; events per second over all."""
    context = multiprocessing.get_context("spawn")
    # Writers and this process meet here: everyone starts when the last writer has connected.
    start: multiprocessing.synchronize.Barrier = context.Barrier(writers + 1, timeout=120)
    queue: Any = context.Queue()
    processes = [
        context.Process(target=_run, args=(target, (*args, start, index), queue), daemon=True)
        for index in range(writers)
    ]
    for process in processes:
        process.start()
    start.wait()
    began = time.monotonic()
    total = sum(_result(queue, processes) for _ in processes)
    elapsed = time.monotonic() - began
    for process in processes:
        process.join(timeout=30)
    return total / elapsed
