"""Commands and events as JSON: attrs classes (un)structured by cattrs, never pickled.

Dramatiq's JSON encoder rejects UUID, Decimal and datetime values, so they are
converted here, at the edge: UUIDs and Decimals to strings, datetimes to ISO 8601.
"""

from __future__ import annotations

import datetime as dt
import decimal
import secrets
import uuid
from typing import Any, TypeVar

import attrs
import cattrs

from estafeta.app.errors import InvalidMessage

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=False)
converter.register_unstructure_hook(uuid.UUID, str)
converter.register_structure_hook(uuid.UUID, lambda value, _: uuid.UUID(str(value)))
converter.register_unstructure_hook(decimal.Decimal, str)
converter.register_structure_hook(decimal.Decimal, lambda value, _: decimal.Decimal(str(value)))
converter.register_unstructure_hook(dt.datetime, lambda value: value.isoformat())
converter.register_structure_hook(dt.datetime, lambda value, _: dt.datetime.fromisoformat(value))


def to_json(message: Any) -> dict[str, Any]:
    """The JSON-ready form of an attrs command or event."""
    if not attrs.has(type(message)):
        raise TypeError(f"{type(message).__name__} is not an attrs class; commands and events must be")
    data = converter.unstructure(message)
    assert isinstance(data, dict)
    return data


def from_json(kind: type[T], data: Any) -> T:
    """Build a ``kind`` from its JSON form; raise :class:`InvalidMessage` with a one-line reason.

    Fields ``kind`` does not know are ignored here (the raw payload keeps them); missing or
    malformed fields are an error.
    """
    if not isinstance(data, dict):
        raise InvalidMessage(f"expected a JSON object for {kind.__name__}, got {type(data).__name__}")
    try:
        return converter.structure(data, kind)
    except Exception as exc:
        details = cattrs.transform_error(exc) if isinstance(exc, cattrs.BaseValidationError) else [str(exc)]
        raise InvalidMessage(f"not a valid {kind.__name__}: {'; '.join(details)}") from None


def new_traceparent(parent: str | None = None) -> str:
    """A W3C ``traceparent`` for a new span, in ``parent``'s trace when it is a valid one."""
    trace_id = secrets.token_hex(16)
    if parent:
        parts = parent.split("-")
        if len(parts) == 4 and len(parts[1]) == 32:
            trace_id = parts[1]
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"
