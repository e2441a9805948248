"""Writing numbered outbox rows and checking the order they reached a broker in (relay tests)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import dramatiq
import psycopg

from estafeta_sql import outbox as store

#: The service whose outbox the relay tests fill, and a queue no worker serves.
SCHEMA = "pingpong"
QUEUE = "relaycheck"


def add(
    conn: psycopg.Connection[Any],
    key: str | None,
    seq: int,
    *,
    queue: str = QUEUE,
    delay: timedelta = timedelta(0),
) -> uuid.UUID:
    """Write one row numbered ``seq`` for ``key`` (in the caller's transaction, if any)."""
    message_id = uuid.uuid4()
    store.insert(
        conn,
        SCHEMA,
        store.OutgoingMessage(
            message_id=message_id,
            queue_name=queue,
            actor_name=f"{queue}.record",
            args=[{"key": key, "seq": seq}],
            ordering_key=key,
            delay=delay,
        ),
    )
    return message_id


def arrivals(messages: Iterable[dramatiq.Message[Any]]) -> list[tuple[str | None, int, str]]:
    """``(key, seq, message_id)`` of each message, in arrival order."""
    return [(m.args[0]["key"], m.args[0]["seq"], str(m.message_id)) for m in messages]


def check_order(arrived: list[tuple[str | None, int, str]], expected: dict[str | None, list[int]]) -> int:
    """Assert every key's rows arrived, each after all earlier ones of its key; return the duplicates.

    A row may arrive twice (a relay killed between the broker's confirm and its
    delete): what counts is the first arrival of each row. Rows must not overtake
    an earlier row of their key.
    """
    firsts: dict[str | None, list[int]] = defaultdict(list)
    seen: set[str] = set()
    duplicates = 0
    for key, seq, message_id in arrived:
        if message_id in seen:
            duplicates += 1
            continue
        seen.add(message_id)
        firsts[key].append(seq)
    for key, seqs in expected.items():
        got = firsts.get(key, [])
        if key is None:
            assert sorted(got) == sorted(seqs), "unkeyed rows lost or invented"
        else:
            assert got == seqs, f"key {key}: arrived {got}, committed {seqs}"
    assert set(firsts) <= set(expected), f"unexpected keys {set(firsts) - set(expected)}"
    return duplicates


def drain_stub(broker: Any, queue: str = QUEUE) -> list[dramatiq.Message[Any]]:
    """Every message now on the StubBroker's ``queue``, in arrival order (removed from it)."""
    found = []
    q = broker.queues[queue]
    while not q.empty():
        found.append(dramatiq.Message.decode(q.get_nowait()))
    return found
