"""Small helpers shared by the tests."""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import dramatiq
import psycopg
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import _RabbitmqMessage

from estafeta import to_json


def as_rabbitmq_delivers(message: dramatiq.Message[Any], *, redelivered: bool) -> MessageProxy:
    """``message`` as Dramatiq's RabbitMQ consumer hands it to the actor, delivered for the first time or again.

    Dramatiq's own class (private, but the consumer's: estafeta's steps read its
    ``redelivered`` flag, and a Dramatiq release that changed it would fail here first).
    """
    return _RabbitmqMessage(redelivered, 0, message)


def message_for(
    actor_name: str, command: Any, *, message_id: uuid.UUID | None = None, **options: Any
) -> dramatiq.Message[Any]:
    """A Dramatiq message as the relay would publish it for ``command``."""
    return dramatiq.Message(
        queue_name=actor_name.split(".")[0],
        actor_name=actor_name,
        args=(to_json(command),),
        kwargs={},
        options=options,
        message_id=str(message_id or uuid.uuid4()),
    )


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    """The first column of the first row."""
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    return row[0] if row else None


def wait_until(check: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05, what: str = "") -> None:
    """Poll ``check`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or check}")


def now() -> datetime:
    return datetime.now(UTC)


def without_docstrings(source: str) -> str:
    """``source`` without its docstrings (and the blank line after a class's), as a page quotes code."""
    lines = source.splitlines(keepends=True)
    dropped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            end = body[0].end_lineno or body[0].lineno
            dropped.update(range(body[0].lineno - 1, end))
            if end < len(lines) and lines[end].strip() == "":
                dropped.add(end)  # the blank line after a class's docstring
    return "".join(line for i, line in enumerate(lines) if i not in dropped)
