"""The saga watchdog: one saga whose hook raises a database error, and one whose participant's
database is renamed away, among sagas falling due while it runs; every other saga is sent again.

The poisoned saga ends ``failed`` with its reason on its row, in the watchdog's error metric
and in ``estafeta sagas list``; the stranded one waits, untouched, and moves on once its
participant's database is back.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import prometheus_client
import psycopg
import pytest
from psycopg import sql as pgsql

from estafeta import App, Runtime, Saga, SagaStep, SagaTransition, Service, Settings, StepContext, Watchdog
from estafeta_sql import sagas
from estafeta_sql.pool import describe_dsn

from ..helpers import wait_until
from ..integration.processes import ROOT, service_env

OWNER = Service("brwd")
NEAR = Service("brnear")
FAR = Service("brfar")  # in a database of its own, renamed away during the test


@attrs.frozen
class Job:
    """The data of the blast-radius sagas."""

    job_id: uuid.UUID
    #: Its ``on_transition`` hook runs a statement that fails (the poisoned saga).
    poisoned: bool = False


@attrs.frozen
class Near:
    job_id: uuid.UUID
    undo: bool = False


@attrs.frozen
class Far:
    job_id: uuid.UUID
    undo: bool = False


@NEAR.step(Near, name="near")
def near(ctx: StepContext, command: Near) -> None:
    return None


@FAR.step(Far, name="far")
def far(ctx: StepContext, command: Far) -> None:
    return None


def hook(conn: psycopg.Connection[Any], transition: SagaTransition) -> None:
    if transition.data is not None and transition.data.poisoned and transition.event != "started":
        conn.execute("SELECT 1/0")


def _step(name: str, command: type, **options: Any) -> SagaStep:
    return SagaStep(
        name,
        action=lambda s: command(s.data.job_id),
        compensation=lambda s: command(s.data.job_id, undo=True),
        **options,
    )


#: Listed first: a pass meets the stranded saga before any other.
STRANDED = Saga("stranded", service=OWNER, data=Job, key="job_id", steps=[_step("far", Far, max_attempts=1)])
WORK = Saga(
    "work", service=OWNER, data=Job, key="job_id", steps=[_step("near", Near, max_attempts=5)], on_transition=hook
)
APP = App("brwd", services=[OWNER, NEAR, FAR])

HEALTHY = 30


@pytest.fixture
def far_database(database_url: str) -> Iterator[str]:
    """A database of its own for the far participant, migrated; dropped (under either name) afterwards."""
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    name = f"{params['dbname']}_brfar"
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        for db in (name, f"{name}_away"):
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(db)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(database_url, dbname=name)
    try:
        yield dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for db in (name, f"{name}_away"):
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(db)))


def rename(dsn: str, *, away: bool) -> None:
    """Rename the database of ``dsn`` away (ending its sessions), or back."""
    name = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    old, new = (name, f"{name}_away") if away else (f"{name}_away", name)
    with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, dbname="postgres"), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (old,))
        conn.execute(pgsql.SQL("ALTER DATABASE {} RENAME TO {}").format(pgsql.Identifier(old), pgsql.Identifier(new)))


@pytest.fixture
def runtime_far(database_url: str, far_database: str, conn: psycopg.Connection[Any]) -> Iterator[Runtime]:
    """A runtime whose ``brfar`` service has a database of its own; every service migrated, sagas emptied."""
    runtime = Runtime(Settings(database_url=database_url, service_database_urls={"brfar": far_database}))
    runtime.migrate([OWNER, NEAR, FAR])
    for saga in (STRANDED, WORK):
        conn.execute(f"TRUNCATE brwd.{saga.table.table}, brwd.{saga.table.log}")
    conn.execute("TRUNCATE brwd.outbox")
    yield runtime
    runtime.close()


def start(runtime: Runtime, saga: Saga, job: Job, *, overdue_by: float, step_timeout: float = 60) -> uuid.UUID:
    """Start a saga whose deadline passed ``overdue_by`` seconds ago."""
    with runtime.database("brwd").transaction() as tx:
        saga_id = saga.start(tx, job, step_timeout=step_timeout)
        tx.execute(
            pgsql.SQL("UPDATE brwd.{} SET deadline_at = now() - make_interval(secs => %s) WHERE saga_id = %s").format(
                pgsql.Identifier(saga.table.table)
            ),
            (overdue_by, saga_id),
        )
    return saga_id


def state(conn: psycopg.Connection[Any], saga: Saga, saga_id: uuid.UUID) -> sagas.SagaRow:
    found = sagas.get(conn, saga.table, saga_id)
    assert found is not None
    return found


def errors_metric() -> float:
    return prometheus_client.REGISTRY.get_sample_value("estafeta_saga_watchdog_errors_total", {"saga": "work"}) or 0.0


@pytest.mark.heavy
def test_a_poisoned_saga_and_a_stranded_one_stop_only_themselves(
    runtime_far: Runtime, database_url: str, far_database: str, conn: psycopg.Connection[Any]
) -> None:
    runtime = runtime_far
    stranded = start(runtime, STRANDED, Job(uuid.uuid4()), overdue_by=3600)
    # The poisoned saga is the most overdue of its kind; its 0.1 s step timeout brings it back at once.
    poisoned = start(runtime, WORK, Job(uuid.uuid4(), poisoned=True), overdue_by=600, step_timeout=0.1)
    healthy = [start(runtime, WORK, Job(uuid.uuid4()), overdue_by=HEALTHY - i) for i in range(HEALTHY)]
    rename(far_database, away=True)
    errors_before = errors_metric()
    watchdog = Watchdog(runtime, [STRANDED, WORK])
    stop = threading.Event()
    thread = threading.Thread(target=watchdog.run, args=(stop, 0.05), daemon=True)
    thread.start()
    try:
        # Sagas keep falling due while it runs.
        for _ in range(5):
            healthy += [start(runtime, WORK, Job(uuid.uuid4()), overdue_by=0) for _ in range(2)]

        def resent() -> int:
            return sum(state(conn, WORK, s).attempts >= 2 for s in healthy)

        wait_until(lambda: resent() == len(healthy), timeout=30, what="every healthy saga sent again")
        wait_until(lambda: state(conn, WORK, poisoned).status == "failed", timeout=30, what="the poisoned saga failed")
        # The poisoned saga says why, on its row, in the metric and in `estafeta sagas list`.
        failed = state(conn, WORK, poisoned)
        assert failed.last_error is not None and "division by zero" in failed.last_error
        assert failed.last_error.endswith("(3 errors in a row)")
        assert errors_metric() - errors_before == 3
        command = ["--app", f"{__name__}:APP", "sagas", "list", "--saga", "work", "--status", "failed"]
        listed = subprocess.run(
            [sys.executable, "-m", "estafeta_cli", *command],
            cwd=ROOT,
            env=service_env(database_url, "stub://"),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert str(poisoned) in listed and "division by zero" in listed, listed
        # The stranded saga waits for its participant, with nothing recorded against it...
        waiting = state(conn, STRANDED, stranded)
        assert (waiting.status, waiting.attempts, waiting.last_error) == ("running", 1, None)
        # ...and moves on once the participant's database is back: its step failed, compensated.
        rename(far_database, away=False)
        wait_until(
            lambda: state(conn, STRANDED, stranded).status == "compensating",
            timeout=60,
            what=f"the stranded saga moved on once {describe_dsn(far_database)} was back",
        )
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(30)
