"""``python -m examples.loyalty.http [PORT]``: an idempotent HTTP endpoint that sends through the outbox.

``POST /awards`` with a JSON body ``{"customer_id": ..., "points": ...}`` and an
``Idempotency-Key`` header. The request is recorded and the command written to the
outbox in one transaction, so a client retrying after a timeout never awards twice and a
crash after the commit never loses the command. Answers 202 (accepted now), 200 (the
same key again), 400 (bad input, one line) or 503 (database unavailable).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

from estafeta import DatabaseError, InvalidMessage, Runtime, from_json

from .service import SERVICE, AwardPoints, request_award

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def make_app(runtime: Runtime) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The WSGI application, writing to ``runtime``'s loyalty database."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        return _handle(runtime, environ, start_response)

    return app


def _handle(runtime: Runtime, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    if environ.get("PATH_INFO") != "/awards" or environ.get("REQUEST_METHOD") != "POST":
        return _answer(start_response, "404 Not Found", {"error": "POST /awards"})
    key = environ.get("HTTP_IDEMPOTENCY_KEY", "").strip()
    if not key or len(key) > 200:
        return _answer(start_response, "400 Bad Request", {"error": "Idempotency-Key header: 1 to 200 characters"})
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        command = from_json(AwardPoints, json.loads(environ["wsgi.input"].read(length) or b"null"))
    except (ValueError, InvalidMessage) as exc:
        return _answer(start_response, "400 Bad Request", {"error": f"body: {exc}"})
    try:
        with runtime.database(SERVICE.name).transaction() as conn:
            message_id, accepted = request_award(conn, key, command)
    except DatabaseError:
        return _answer(start_response, "503 Service Unavailable", {"error": "database unavailable, retry"})
    status = "202 Accepted" if accepted else "200 OK"
    return _answer(start_response, status, {"message_id": str(message_id), "accepted": accepted})


def _answer(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    from . import binding

    with make_server("127.0.0.1", port, make_app(binding.runtime)) as server:
        print(f"loyalty awards on http://127.0.0.1:{port}/awards")
        server.serve_forever()
