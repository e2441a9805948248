"""``estafeta demo`` on Kafka: two ``dramatiq estafeta_actors`` processes and the relay, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .processes import ROOT, service_env

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def test_the_demo_runs_end_to_end_on_kafka_and_reconciles(kafka_url: str, database_url: str, runtime) -> None:
    env = service_env(database_url, kafka_url, ESTAFETA_SAGA_STEP_TIMEOUT="30")
    result = subprocess.run(
        [sys.executable, "-m", "estafeta_cli", "demo", "--orders", "60", "--seed", "3", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["reconciled"] is True, summary
    assert summary["completed"] + summary["compensated"] == 60
    assert summary["completed"] and summary["compensated"] and not summary["failed"]
    # Every tenth message went out twice (a relay dying between Kafka's ack and its delete),
    # and the workers' inboxes absorbed each copy.
    assert summary["duplicates_published"] > 0
    assert summary["duplicates_absorbed"] == summary["duplicates_published"]
