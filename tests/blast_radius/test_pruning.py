"""Pruning with one poisoned table: every other table and service is pruned, the bad one is reported with its reason.

The poisons: a table renamed away (a half-applied migration), a table held in ACCESS
EXCLUSIVE mode (``LOCK TABLE``, ``VACUUM FULL``, a migration in progress), and a row that
refuses to go (a trigger raises on delete). Pruning them fails; nothing else must.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from estafeta import Runtime
from estafeta.operations.retention import PruneReport, Retention, prune
from tests.app import app as tests_app

from ..helpers import scalar
from ..integration.processes import service_env
from ..test_cli import run

SERVICES = [service.name for service in tests_app.services]
POISONED = "probe"
REASONS = {
    "missing": 'UndefinedTable: relation "probe.inbox_attempts" does not exist',
    "locked": "LockNotAvailable: canceling statement due to lock timeout",
    "undeletable": "RaiseException: this row stays",
}


def old_delivery_counts(conn: psycopg.Connection[Any]) -> None:
    """One delivery count eight days old in every service."""
    for service in SERVICES:
        conn.execute(
            f"INSERT INTO {service}.inbox_attempts (consumer, message_id, last_attempt_at)"
            " VALUES ('blast.radius', gen_random_uuid(), now() - interval '8 days')"
        )


@pytest.fixture
def poisoned(request: pytest.FixtureRequest, conn: psycopg.Connection[Any], database_url: str) -> Iterator[str]:
    """Old rows in every service, then ``probe.inbox_attempts`` made unprunable as the parameter says (undone after)."""
    poison: str = request.param
    old_delivery_counts(conn)
    holder = psycopg.connect(database_url)
    if poison == "missing":
        conn.execute("ALTER TABLE probe.inbox_attempts RENAME TO inbox_attempts_away")
    elif poison == "locked":
        holder.execute("LOCK TABLE probe.inbox_attempts IN ACCESS EXCLUSIVE MODE")
    else:
        conn.execute(
            "CREATE FUNCTION probe.refuse_delete() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'this row stays'; END $$;"
            " CREATE TRIGGER refuse_delete BEFORE DELETE ON probe.inbox_attempts"
            " FOR EACH ROW EXECUTE FUNCTION probe.refuse_delete()"
        )
    try:
        yield poison
    finally:
        holder.close()
        if poison == "missing":
            conn.execute("ALTER TABLE probe.inbox_attempts_away RENAME TO inbox_attempts")
        elif poison == "undeletable":
            conn.execute("DROP FUNCTION probe.refuse_delete() CASCADE")


def pruned_within(runtime: Runtime, seconds: float) -> PruneReport:
    """Prune every service of the tests' app in a thread; fail if it has not finished within ``seconds``."""
    week = Retention(timedelta(days=7), timedelta(days=7), timedelta(days=1), timedelta(days=30), lock_timeout=0.2)
    done: list[PruneReport] = []
    crashed: list[BaseException] = []

    def prune_all() -> None:
        try:
            done.append(prune(runtime, tests_app.services, tests_app.sagas, retention=week))
        except Exception as exc:
            crashed.append(exc)

    thread = threading.Thread(target=prune_all, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not crashed, f"the whole prune crashed: {crashed[0]!r}"
    assert done, f"the prune did not finish within {seconds} s"
    return done[0]


@pytest.mark.parametrize("poisoned", ["missing", "locked", "undeletable"], indirect=True)
def test_one_table_that_cannot_be_pruned_stops_only_itself(
    runtime: Runtime, conn: psycopg.Connection[Any], poisoned: str
) -> None:
    labels = {"service": POISONED, "table": "inbox_attempts"}
    failures_before = REGISTRY.get_sample_value("estafeta_prune_failures_total", labels) or 0
    report = pruned_within(runtime, 30)
    assert report.failures == {POISONED: {"inbox_attempts": REASONS[poisoned]}}
    for service in SERVICES:
        expected = {"inbox_attempts": 1} if service != POISONED else {}
        counts = report.counts[service]
        assert {t: counts[t] for t in expected} == expected, f"{service} was pruned"
        assert {"dead_letters", "inbox", "fences"} <= set(counts), f"{service}'s other tables were pruned"
        if service != POISONED:
            assert scalar(conn, f"SELECT count(*) FROM {service}.inbox_attempts") == 0
    assert {"saga_twice_log", "saga_loan_log", "saga_typo_log"} <= set(report.counts[POISONED])
    assert REGISTRY.get_sample_value("estafeta_prune_failures_total", labels) == failures_before + 1


def test_the_prune_command_reports_the_table_it_could_not_prune_and_prunes_the_rest(
    runtime: Runtime, conn: psycopg.Connection[Any], database_url: str
) -> None:
    old_delivery_counts(conn)
    conn.execute("ALTER TABLE pingpong.inbox_attempts RENAME TO inbox_attempts_away")
    try:
        done = run(service_env(database_url, "stub://"), "prune")
    finally:
        conn.execute("ALTER TABLE pingpong.inbox_attempts_away RENAME TO inbox_attempts")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    reason = 'UndefinedTable: relation "pingpong.inbox_attempts" does not exist'
    assert f"pingpong.inbox_attempts: not pruned: {reason}" in lines
    assert lines[-1] == "estafeta: 1 table(s) not pruned (above); the others were; run again once fixed"
    assert "pingpong: deleted dead_letters 0, inbox 0, inbox_attempts" not in done.stdout
    assert "payments: deleted dead_letters 0, inbox 0, inbox_attempts 1, fences 0" in done.stdout.splitlines()
    for service in ("orders", "payments", "inventory", "notifications"):
        assert scalar(conn, f"SELECT count(*) FROM {service}.inbox_attempts") == 0
