"""Where a delivery's message goes when the step is done with it: answered, or parked.

A step answers the sender that asked (``reply_to``) with a :class:`Reply` through the
outbox; a refusal nobody waits for is parked in the service's dead letters instead. A
message the step will not process (undecodable, over-delivered, failing its last allowed
attempt) is parked once. Apart from the delivery's transaction, which calls these at
its end.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import attrs
import dramatiq

from estafeta.app.runtime import Runtime
from estafeta.messaging import outbox as outbox
from estafeta.messaging.messages import to_json
from estafeta.steps.context import REPLY_TO, Reply, StepContext
from estafeta.steps.outcome import Outcome
from estafeta.steps.spec import StepSpec
from estafeta_sql import inbox
from estafeta_sql.pool import Database

# A delivery's log lines come from one logger, whichever module writes them: a logging
# configuration (and an operator's filter) names it.
logger = logging.getLogger("estafeta.steps.delivery")


def answer(
    ctx: StepContext,
    spec: StepSpec,
    message_id: str,
    *,
    ok: bool,
    result: Any = None,
    error: str | None = None,
) -> None:
    """Answer the sender of ``message_id`` in ``ctx``'s transaction, or park a refusal nobody waits for."""
    reply_to = ctx.options.get(REPLY_TO)
    if not reply_to:
        if not ok:
            # Nobody waits for an answer: park the refusal where an operator will see it.
            logger.warning("%s: business failure for %s: %s", spec.actor_name, message_id, error)
            inbox.dead_letter(
                ctx.conn,
                spec.service,
                spec.actor_name,
                message_id,
                {"args": [ctx.payload], "options": ctx.options},
                f"business failure: {error}",
            )
        return
    body = Reply(
        in_reply_to=message_id,
        ok=ok,
        context=dict(reply_to.get("context") or {}),
        result=to_json(result) if attrs.has(type(result)) else result,
        error=error,
    )
    ctx.send(
        body,
        to=outbox.Address(reply_to["actor"], reply_to["queue"]),
        ordering_key=reply_to.get("ordering_key"),
    )


def is_last_attempt(spec: StepSpec, runtime: Runtime, message: dramatiq.Message[Any]) -> bool:
    """Whether this delivery of ``message`` is the last Dramatiq allows ``spec`` (its ``max_retries``)."""
    default = spec.actor_options.get("max_retries", runtime.settings.max_retries)
    max_retries = message.options.get("max_retries", default)
    return max_retries is not None and int(message.options.get("retries", 0)) >= int(max_retries)


def park(
    spec: StepSpec,
    database: Database,
    message_id: uuid.UUID | None,
    shown_id: str,
    raw: dict[str, Any],
    reason: str,
    *,
    logged: bool = True,
) -> Outcome:
    """Dead-letter a message once (the inbox record keeps a redelivery from parking it again).

    ``logged=False``: no log line (the caller says it once for many, ``estafeta.steps.foreign``).
    """
    with database.transaction() as conn:
        if message_id is not None:
            if not inbox.record(conn, spec.service, spec.actor_name, message_id):
                return Outcome.DUPLICATE
            inbox.forget_attempts(conn, spec.service, spec.actor_name, message_id)
        inbox.dead_letter(conn, spec.service, spec.actor_name, shown_id, raw, f"{spec.actor_name}: {reason}")
    if logged:
        logger.error("%s: message %s dead-lettered: %s", spec.actor_name, shown_id, reason)
    return Outcome.DEAD_LETTERED
