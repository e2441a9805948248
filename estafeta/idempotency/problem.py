"""HTTP problems (RFC 9457) and responses as plain values, free of any web framework."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from estafeta_sql.errors import EstafetaError

#: The media type of a problem document.
PROBLEM_JSON = "application/problem+json"


def _pairs(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(name), str(value)) for name, value in pairs)


@attrs.frozen
class HttpResponse:
    """A response as status, headers and body bytes: what a handler answers and a key's record replays."""

    status: int
    #: (name, value) pairs, in order.
    headers: tuple[tuple[str, str], ...] = attrs.field(converter=_pairs)
    body: bytes = b""
    #: ``True`` when this is the stored answer to an earlier request with the same key.
    replayed: bool = False

    @classmethod
    def json(cls, status: int, document: Any, headers: Mapping[str, str] | None = None) -> HttpResponse:
        """A JSON response (``Content-Type: application/json``) with ``headers`` after it."""
        body = json.dumps(document, separators=(",", ":")).encode()
        return cls(status, (("content-type", "application/json"), *(headers or {}).items()), body)


class Problem(EstafetaError):
    """A request the API refuses, answered as an ``application/problem+json`` document.

    The class attributes are the defaults of each kind of problem; ``detail`` says what
    was wrong with this request. Raised by a handler that
    :meth:`estafeta.Idempotency.run` runs, a 4xx problem is the request's answer (stored
    and replayed for its key, the handler's writes rolled back); a 5xx stores nothing.
    """

    #: The HTTP status code.
    status: int = 500
    #: A URI naming the kind of problem (``about:blank``: the status says it all).
    type: str = "about:blank"
    #: A short summary of the kind of problem, the same for every occurrence.
    title: str = "Internal Server Error"

    def __init__(
        self,
        detail: str | None = None,
        *,
        status: int | None = None,
        title: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail or title or self.title)
        self.detail = str(self)
        if status is not None:
            self.status = status
        if title is not None:
            self.title = title
        if type is not None:
            self.type = type
        #: Extra response headers (``Retry-After``).
        self.headers: dict[str, str] = dict(headers or {})

    def document(self) -> dict[str, Any]:
        """The problem document: type, title, status and detail."""
        return {"type": self.type, "title": self.title, "status": self.status, "detail": self.detail}

    def response(self) -> HttpResponse:
        """The problem as a response (``Content-Type: application/problem+json``)."""
        body = json.dumps(self.document(), separators=(",", ":")).encode()
        return HttpResponse(self.status, (("content-type", PROBLEM_JSON), *self.headers.items()), body)
