"""``estafeta sagas start``: a saga of any app started from JSON; bad input is one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from estafeta import Runtime

from .helpers import scalar
from .integration.processes import ROOT, service_env


def run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", "--app", "examples.booking", "sagas", "start", *args],
        cwd=ROOT, env=service_env(database_url, "stub://"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_saga_starts_from_json_with_its_first_command_in_the_outbox(database_url: str, runtime: Runtime) -> None:
    booking_id = uuid.uuid4()
    started = run(database_url, f'{{"booking_id": "{booking_id}", "guest": "ann", "nights": 2}}')
    assert started.returncode == 0, started.stderr
    saga_id = uuid.UUID(started.stdout.strip())
    with runtime.database("desk").connection() as conn:
        assert scalar(conn, "SELECT status FROM desk.saga_booking WHERE saga_id = %s", saga_id) == "running"
        assert scalar(conn, "SELECT booking_id FROM desk.saga_booking WHERE saga_id = %s", saga_id) == booking_id
        command = scalar(conn, "SELECT message->'args'->0 FROM desk.outbox WHERE saga_id = %s", saga_id)
    assert command == {"booking_id": str(booking_id), "amount": 200}
    again = run(database_url, "--id", str(saga_id), f'{{"booking_id": "{booking_id}", "guest": "ann", "nights": 2}}')
    assert again.returncode == 0 and again.stdout.strip() == str(saga_id), again.stderr
    with runtime.database("desk").connection() as conn:
        assert scalar(conn, "SELECT count(*) FROM desk.saga_booking") == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--saga", "nope", "{}"], "Invalid value for --saga: no saga kind 'nope' in app booking (declared: booking)"),
        (['{"guest": "ann",'], "Invalid value for DATA: not JSON: Expecting property name enclosed in double quotes"),
        (["[1, 2]"], "Invalid value for DATA: expected a JSON object, got list"),
        (['{"guest": "ann", "nights": 2}'], "Invalid value for DATA: not a valid Booking: required field missing"),
        (['{"booking_id": "x", "guest": "ann", "nights": 2}'], "Invalid value for DATA: not a valid Booking:"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(database_url: str, args: list[str], expected: str) -> None:
    done = run(database_url, *args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"estafeta sagas start: {expected}"), done.stderr
