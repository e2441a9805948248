"""The state of an event stream's aggregate, replayed from its events as of a version or a time.

Apart because two readers show it: ``estafeta events show`` (:mod:`estafeta_cli.projections`) and the
console's events page (:mod:`estafeta_console.data.read_models`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import attrs

from estafeta import EventStore, Service


def aggregate_state(
    conn: Any, service: Service, store: EventStore, stream_id: str, version: int | None, as_of: datetime | None
) -> dict[str, Any] | None:
    """The state of the stream's aggregate, when the service declared one for its stream type."""
    from estafeta import Repository
    from estafeta_sql import event_store

    found = event_store.stream_state(conn, service.name, stream_id)
    kinds = {getattr(cls, "stream_type", None) or cls.__name__: cls for cls in service.aggregates}
    cls = kinds.get(found.type) if found else None
    if cls is None:
        return None
    aggregate: Any = Repository(store, cls).load(conn, stream_id, version=version, as_of=as_of)
    return {"version": aggregate.version, **json.loads(json.dumps(attrs.asdict(aggregate), default=str))}
