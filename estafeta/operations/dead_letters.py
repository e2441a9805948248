"""Dead letters an operator can act on: listed, grouped by cause and read.

A dead letter is a message a step will not process (undecodable, failing every retry,
refused with nobody waiting, killing its workers), kept in its service's
``dead_letters`` with the reason. Grouping puts together those with one cause: the
step, the error type and the error message with its ids and numbers blanked out.

A replay (``estafeta.operations.dead_letter_replay``) sends a parked letter again, once.
The CLI (``estafeta dead-letters``) and the HTTP console list, show and group through
this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import attrs

from estafeta.app.runtime import Runtime
from estafeta.operations.dead_letter_causes import Cause, cause_of
from estafeta_sql import dead_letters as store


@attrs.frozen
class DeadLetter:
    """A dead letter of one service."""

    service: str
    id: int
    consumer: str
    message_id: str
    message: dict[str, Any]
    reason: str
    created_at: datetime
    #: ``parked``, ``replayed`` or ``obsolete``.
    status: str
    resolved_at: datetime | None
    replayed_as: uuid.UUID | None
    note: str | None

    @classmethod
    def of(cls, service: str, row: store.DeadLetterRow) -> DeadLetter:
        """The stored row, with its service."""
        return cls(service, **attrs.asdict(row, recurse=False))

    @property
    def cause(self) -> Cause:
        """Why it was parked."""
        return cause_of(self.consumer, self.reason)


@attrs.frozen
class Group:
    """Parked dead letters with one cause."""

    service: str
    cause: Cause
    #: Their ids, oldest first.
    ids: tuple[int, ...]
    first_at: datetime
    last_at: datetime

    @property
    def group(self) -> str:
        """The cause's id."""
        return self.cause.group

    @property
    def count(self) -> int:
        """How many are parked."""
        return len(self.ids)


def groups(runtime: Runtime, services: Iterable[str]) -> list[Group]:
    """The parked dead letters of ``services`` grouped by cause, the largest group first."""
    found: dict[tuple[str, Cause], list[store.CauseRow]] = {}
    for service in services:
        with runtime.database(service).connection() as conn:
            for row in store.causes(conn, service):
                found.setdefault((service, cause_of(row.consumer, row.reason)), []).append(row)
    result = [
        Group(service, cause, tuple(r.id for r in rows), rows[0].created_at, rows[-1].created_at)
        for (service, cause), rows in found.items()
    ]
    return sorted(result, key=lambda g: (-g.count, g.first_at))


def list_dead_letters(
    runtime: Runtime,
    services: Iterable[str],
    *,
    status: str | None = "parked",
    group: str | None = None,
    limit: int = 100,
) -> list[DeadLetter]:
    """Dead letters of ``services``, newest first: in ``status`` (``None``: any), or the parked ones of ``group``."""
    found: list[DeadLetter] = []
    for service in services:
        with runtime.database(service).connection() as conn:
            if group is None:
                rows = store.search(conn, service, status=status, limit=limit)
            else:
                ids = [i for g in groups(runtime, [service]) if g.group == group for i in g.ids]
                rows = store.get_many(conn, service, ids) if ids else []
        found += [DeadLetter.of(service, row) for row in rows]
    return sorted(found, key=lambda letter: letter.created_at, reverse=True)[:limit]


def show(runtime: Runtime, services: Sequence[str], letter_id: int) -> DeadLetter:
    """The dead letter ``letter_id``; ``LookupError`` if no service (or more than one) of ``services`` has it."""
    (service,) = locate(runtime, services, letter_id)
    with runtime.database(service).connection() as conn:
        row = store.get(conn, service, letter_id)
    assert row is not None
    return DeadLetter.of(service, row)


def locate(runtime: Runtime, services: Sequence[str], letter_id: int) -> list[str]:
    """The service of ``services`` holding dead letter ``letter_id``, as a one-item list.

    ``LookupError`` if none of them has it, or more than one does.
    """
    holders = []
    for service in services:
        with runtime.database(service).connection() as conn:
            if store.get(conn, service, letter_id) is not None:
                holders.append(service)
    if not holders:
        raise LookupError(f"no dead letter {letter_id} in {', '.join(services)}")
    if len(holders) > 1:
        raise LookupError(f"dead letter {letter_id} exists in {' and '.join(holders)}: name the service")
    return holders
