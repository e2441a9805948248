"""Log lines written while a message is processed name it: actor, message id, saga id, trace id.

A handler with estafeta's filter is attached to the root logger, as in a ``dramatiq``
worker process: what the step's transaction logs (here, the warning for a business
failure nobody waits for) carries the fields, in JSON and in text; the payload never
appears; a line written outside a delivery carries none.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator

import pytest

from estafeta import Outcome, Runtime, deliver
from estafeta.messaging.messages import new_traceparent
from estafeta.observability import logs as logs

from .app import STEPS
from .helpers import message_for
from .steps import Refuse


@pytest.fixture(params=["json", "text"])
def written(request: pytest.FixtureRequest) -> Iterator[tuple[str, io.StringIO]]:
    """What the root logger writes at INFO through a handler set up like a worker's."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(name)s] [%(levelname)s] %(message)s"))
    logs.adopt_handlers(request.param, [handler])
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield request.param, stream
    root.removeHandler(handler)
    root.setLevel(level)


def test_lines_logged_while_a_message_is_processed_carry_its_ids_and_never_its_payload(
    runtime: Runtime, conn, written: tuple[str, io.StringIO]
) -> None:
    log_format, stream = written
    spec = STEPS["probe.test_refuse"]
    ping_id, saga_id, traceparent = uuid.uuid4(), uuid.uuid4(), new_traceparent()
    message = message_for(spec.actor_name, Refuse(ping_id), saga_id=str(saga_id), traceparent=traceparent)
    assert deliver(spec, runtime, message) is Outcome.FAILED
    logging.getLogger("an.app").info("after the delivery")
    lines = stream.getvalue().splitlines()
    warning = next(line for line in lines if "business failure" in line)
    after = next(line for line in lines if "after the delivery" in line)
    expected = {
        "actor": "probe.test_refuse",
        "message_id": message.message_id,
        "saga_id": str(saga_id),
        "trace_id": traceparent.split("-")[1],
    }
    if log_format == "json":
        record = json.loads(warning)
        assert {key: record[key] for key in expected} == expected
        assert record["level"] == "WARNING" and record["logger"] == "estafeta.steps.delivery"
        assert not set(expected) & set(json.loads(after))
    else:
        assert warning.startswith("[estafeta.steps.delivery] [WARNING] probe.test_refuse: business failure")
        assert warning.endswith("[" + " ".join(f"{k}={v}" for k, v in expected.items()) + "]")
        assert after == "[an.app] [INFO] after the delivery"
    assert str(ping_id) not in stream.getvalue()  # the payload's id: never logged


def test_an_exception_stays_in_its_json_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("estafeta.test_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with logs.processing(logs.Delivery("svc.step", "m-1", None, None)):
            try:
                raise ValueError("bad row")
            except ValueError:
                logger.exception("could not do it")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "could not do it" and record["actor"] == "svc.step"
    assert "saga_id" not in record
    assert record["exception"].startswith("Traceback") and "ValueError: bad row" in record["exception"]
