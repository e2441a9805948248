"""Choreography (examples/welcome): customer registered -> bonus activated -> welcome mail.

Runs the example as a user would, in its own process, on this run's database.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .integration.processes import ROOT, service_env


def test_each_registration_flows_through_every_subscriber_with_its_saga_id(database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.welcome", "--customers", "3", "--json"],
        cwd=ROOT,
        env=service_env(database_url, "stub://"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    journeys = json.loads(result.stdout)
    assert len(journeys) == 3
    for journey in journeys:
        # The bonus service reacted to the registration, then both subscribers of its
        # event did: the mailer and the customers service; one saga id all the way.
        assert journey["bonus_points"] == journey["recorded_points"] == 100
        assert journey["mail_saga_id"] == journey["bonus_saga_id"] is not None
    assert len({j["bonus_saga_id"] for j in journeys}) == 3
