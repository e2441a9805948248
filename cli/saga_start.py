"""``estafeta sagas start``: start a saga of any kind from its data as JSON, in a transaction of its own."""

from __future__ import annotations

import json
import uuid
from typing import Any

import click

from estafeta import InvalidMessage, from_json

from .context import current


def parse_object(text: str) -> dict[str, Any]:
    """``text`` as a JSON object; a one-line usage error naming what is wrong otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise click.BadParameter(f"not JSON: {exc.msg} ({where})", param_hint="DATA") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"expected a JSON object, got {type(data).__name__}", param_hint="DATA")
    return data


@click.command("start")
@click.argument("data")
@click.option("--saga", "kind", help="The saga kind (default: the app's only one).")
@click.option(
    "--id", "saga_id", type=click.UUID, help="The saga's id (default: a new one); starting it again does nothing."
)
def start_command(data: str, kind: str | None, saga_id: uuid.UUID | None) -> None:
    """Start a saga whose data is DATA, a JSON object of the saga's data class; print its id.

    The saga's row, its log and its first command commit together, in a transaction of this
    command's own, as `Saga.start` does in an app's; the relay publishes the command. For a
    saga whose first step is done by the code that starts it (a row written in the same
    transaction), start it from that code instead.
    """
    context = current()
    saga = context.saga(kind)
    try:
        value: Any = from_json(saga.data, parse_object(data))
    except InvalidMessage as exc:
        raise click.BadParameter(str(exc), param_hint="DATA") from None
    with context.runtime.database(saga.service).transaction() as conn:
        started = saga.start(conn, value, saga_id=saga_id)
    click.echo(str(started))
