"""Finding sagas from what an operator has at hand: a saga id, a business key (an order id), or the start of either.

What support hands over is rarely a saga id: it is an order id, or the first characters of
one read over the phone. :func:`find_sagas` tries, in every saga kind of the app, the
saga id and the kind's key (whatever its type), whole or as a prefix of at least
:data:`SHORTEST_PREFIX` characters; each lookup walks an index (:mod:`estafeta_sql.saga_lookup`).
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from estafeta import App, Runtime, Saga
from estafeta_sql import saga_lookup
from estafeta_sql.sagas import SagaRow

#: The fewest characters taken as a prefix: fewer would match a sixteenth of every table.
SHORTEST_PREFIX = 4
#: Sagas listed at most when a prefix matches many.
MOST = 50
#: A uuid written whole, with its dashes.
_WHOLE_UUID = 36


class NotSearchable(ValueError):
    """The text typed cannot name a saga (too short, too long)."""


@attrs.frozen
class FoundSaga:
    """A saga found, its kind, and what matched: ``saga id`` or the key's name (``order_id``)."""

    kind: str
    row: SagaRow
    by: str


def find_sagas(app: App, runtime: Runtime, text: str) -> list[FoundSaga]:
    """Every saga (at most :data:`MOST` per lookup) whose id or key is ``text``, or starts with it.

    :class:`NotSearchable` when ``text`` is empty, too short for a prefix (and no key equals
    it), or longer than any id.
    """
    text = text.strip()
    if not text:
        raise NotSearchable("type a saga id, an order id (any saga's key), or their first characters")
    if len(text) > 200:
        raise NotSearchable("longer than any saga id or key (200 characters at most)")
    found: list[FoundSaga] = []
    for saga in app.sagas:
        with runtime.database(saga.service).connection() as conn:
            found += [FoundSaga(saga.name, row, "saga id") for row in _by_id(conn, saga, text)]
            found += [FoundSaga(saga.name, row, saga.key) for row in _by_key(conn, saga, text)]
    if not found and len(text.replace("-", "")) < SHORTEST_PREFIX:
        raise NotSearchable(f"{text!r}: give at least {SHORTEST_PREFIX} characters of an id")
    return found


def _by_id(conn: psycopg.Connection[Any], saga: Saga, text: str) -> list[SagaRow]:
    bounds = saga_lookup.uuid_range(text)
    if bounds is None or not _prefix_long_enough(text):
        return []
    return saga_lookup.by_id_range(conn, saga.table, *bounds, MOST)


def _by_key(conn: psycopg.Connection[Any], saga: Saga, text: str) -> list[SagaRow]:
    if saga.key_type == "uuid":
        bounds = saga_lookup.uuid_range(text)
        if bounds is None or not _prefix_long_enough(text):
            return []
        return saga_lookup.by_key_range(conn, saga.table, *bounds, MOST)
    if saga.key_type == "bigint":
        if not text.lstrip("-").isdigit() or abs(int(text)) >= 2**63:
            return []
        return saga_lookup.by_key(conn, saga.table, int(text), MOST)
    return saga_lookup.by_key(conn, saga.table, text, MOST)


def _prefix_long_enough(text: str) -> bool:
    return len(text.replace("-", "")) >= SHORTEST_PREFIX or len(text) == _WHOLE_UUID
