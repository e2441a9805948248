"""Retention: old inbox records, delivery counts, dead letters, fence rows and logs of ended sagas are pruned.

Pruning must never let a duplicate through within the retention window, never let a
stale lock holder in, and never wait on a row someone holds.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Settings, SettingsError, StaleFencingToken, deliver
from estafeta.operations.retention import Retention, prune
from estafeta_actors.pingpong import Ping
from estafeta_sql import fences
from tests.app import STEPS
from tests.app import app as tests_app

from .conftest import TEST_SETTINGS
from .helpers import message_for, now, scalar, wait_until
from .probe_sagas import Once
from .shop import Courier, place, seed
from .test_cli import run

PING = STEPS["pingpong.ping"]
ONCE = STEPS["probe.test_once"]
WEEK = Retention(
    inbox=timedelta(days=7),
    dead_letters=timedelta(days=7),
    fences=timedelta(days=1),
    saga_log=timedelta(days=30),
    batch_size=1000,
)


def ping(runtime: Runtime, message_id: uuid.UUID | None = None, **options: Any) -> Any:
    message = message_for("pingpong.ping", Ping(uuid.uuid4(), now()), message_id=message_id, **options)
    assert deliver(PING, runtime, message) == "ok"
    return message


def age(conn, table: str, column: str, days: float, where: str = "true") -> None:
    conn.execute(f"UPDATE {table} SET {column} = now() - make_interval(secs => %s) WHERE {where}", (days * 86400,))


def pruned(runtime: Runtime, retention: Retention = WEEK, **kwargs: Any) -> dict[str, dict[str, int]]:
    report = prune(runtime, tests_app.services, tests_app.sagas, retention=retention, **kwargs)
    assert report.failures == {}
    return report.counts


def test_pruning_never_lets_a_duplicate_through_within_the_retention_window(runtime: Runtime, conn) -> None:
    recent, old = (message_for("probe.test_once", Once(uuid.uuid4())) for _ in range(2))
    for message in (recent, old):
        assert deliver(ONCE, runtime, message) == "ok"
    age(conn, "probe.inbox", "processed_at", 6.9, f"message_id = '{recent.message_id}'")
    age(conn, "probe.inbox", "processed_at", 7.1, f"message_id = '{old.message_id}'")
    assert pruned(runtime, dry_run=True)["probe"]["inbox"] == 1
    assert scalar(conn, "SELECT count(*) FROM probe.inbox") == 2  # a dry run deletes nothing
    assert pruned(runtime)["probe"]["inbox"] == 1
    assert deliver(ONCE, runtime, recent) == "duplicate"  # within the window: still absorbed
    assert deliver(ONCE, runtime, old) == "ok"  # a copy a week late: beyond what the inbox promises


def test_a_dead_letters_inbox_record_stays_as_long_as_the_dead_letter(runtime: Runtime, conn) -> None:
    # The record keeps a late copy of the parked message from running beside its replay.
    parked = message_for("pingpong.ping", Ping(uuid.uuid4(), now())).copy(args=({"sent_at": "yesterday"},))
    assert deliver(PING, runtime, parked) == "dead_lettered"
    age(conn, "pingpong.inbox", "processed_at", 30)
    assert pruned(runtime)["pingpong"]["inbox"] == 0
    assert deliver(PING, runtime, parked) == "duplicate"
    age(conn, "pingpong.dead_letters", "created_at", 8)
    counts = pruned(runtime)["pingpong"]
    assert (counts["dead_letters"], counts["inbox"]) == (1, 1)


def test_old_delivery_counts_and_dead_letters_go_in_batches(runtime: Runtime, conn) -> None:
    for _ in range(5):
        conn.execute(
            "INSERT INTO pingpong.inbox_attempts (consumer, message_id, attempts, last_attempt_at)"
            " VALUES ('pingpong.ping', gen_random_uuid(), 1, now() - interval '8 days')"
        )
        conn.execute(
            "INSERT INTO pingpong.dead_letters (consumer, message_id, message, reason, created_at)"
            " VALUES ('pingpong.ping', gen_random_uuid(), '{}', 'x', now() - interval '8 days')"
        )
    conn.execute(
        "INSERT INTO pingpong.inbox_attempts (consumer, message_id) VALUES ('pingpong.ping', gen_random_uuid())"
    )
    counts = pruned(runtime, Retention(**{**vars_of(WEEK), "batch_size": 2}))["pingpong"]
    assert (counts["inbox_attempts"], counts["dead_letters"]) == (5, 5)
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox_attempts") == 1


def vars_of(retention: Retention) -> dict[str, Any]:
    import attrs

    return attrs.asdict(retention)


def test_only_the_logs_of_sagas_ended_long_ago_go(runtime: Runtime, conn) -> None:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    ended = place(runtime, "c1", "s1", 1, 100)
    Courier(runtime, conn).run()
    running = place(runtime, "c1", "s1", 1, 100)
    assert scalar(conn, "SELECT status FROM orders.saga_order WHERE saga_id = %s", ended.saga_id) == "completed"
    age(conn, "orders.saga_order", "completed_at", 31, f"saga_id = '{ended.saga_id}'")
    age(conn, "orders.saga_order_log", "at", 31)
    assert pruned(runtime)["orders"]["saga_order_log"] == 5
    logged = {r[0] for r in conn.execute("SELECT DISTINCT saga_id FROM orders.saga_order_log").fetchall()}
    assert logged == {running.saga_id}
    assert scalar(conn, "SELECT count(*) FROM orders.saga_order") == 2  # the saga rows stay (idempotent placing)


def test_a_pruned_fence_row_cannot_let_a_stale_holder_in(runtime: Runtime, conn, database_url: str) -> None:
    key = f"order:{uuid.uuid4()}"
    assert fences.advance(conn, "pingpong", key, 7) is None  # holder 7 starts, then pauses past its lease
    age(conn, "pingpong.fences", "raised_at", 2)
    assert pruned(runtime)["pingpong"]["fences"] == 1
    # Its row is gone: holder 7 wakes and is refused at its check, rolled back.
    with psycopg.connect(database_url) as paused, pytest.raises(StaleFencingToken, match="fence row is gone"):
        fences.check(paused, "pingpong", key, 7)
    # A successor records its token afterwards, in a table without the old row: it gets in,
    # and the stale holder is refused all the same (a newer token is there now).
    assert fences.advance(conn, "pingpong", key, 8) is None
    with psycopg.connect(database_url) as paused, pytest.raises(StaleFencingToken, match="token 8"):
        fences.check(paused, "pingpong", key, 7)
    with psycopg.connect(database_url) as successor:
        fences.check(successor, "pingpong", key, 8)


def test_pruning_never_waits_on_a_fence_row_a_holder_is_committing_with(runtime: Runtime, conn, database_url) -> None:
    key = f"order:{uuid.uuid4()}"
    fences.advance(conn, "pingpong", key, 1)
    age(conn, "pingpong.fences", "raised_at", 2)
    with psycopg.connect(database_url) as holder:
        fences.check(holder, "pingpong", key, 1)  # FOR SHARE until its commit
        done: list[dict[str, dict[str, int]]] = []
        thread = threading.Thread(target=lambda: done.append(pruned(runtime)), daemon=True)
        thread.start()
        thread.join(10)
        assert done and done[0]["pingpong"]["fences"] == 0  # skipped, not waited for
        holder.commit()
    assert pruned(runtime)["pingpong"]["fences"] == 1


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ESTAFETA_INBOX_RETENTION": "3d"}, "ESTAFETA_INBOX_RETENTION: 3 days is shorter than"),
        ({"ESTAFETA_DEAD_LETTER_RETENTION": "2w"}, "ESTAFETA_DEAD_LETTER_RETENTION: '2w' is not a duration"),
        ({"ESTAFETA_PRUNE_INTERVAL": "-1h"}, "ESTAFETA_PRUNE_INTERVAL: '-1h' is not a duration"),
    ],
)
def test_retention_settings_are_checked(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(environ)


def test_durations_read_as_an_operator_writes_them() -> None:
    settings = Settings.from_env(
        {
            "ESTAFETA_INBOX_RETENTION": "14d",
            "ESTAFETA_DEAD_LETTER_RETENTION": "36h",
            "ESTAFETA_FENCE_RETENTION": "90m",
            "ESTAFETA_SAGA_LOG_RETENTION": "3600",
            "ESTAFETA_PRUNE_INTERVAL": "0",
        }
    )
    assert settings.inbox_retention == timedelta(days=14)
    assert settings.dead_letter_retention == timedelta(hours=36)
    assert settings.fence_retention == timedelta(minutes=90)
    assert settings.saga_log_retention == timedelta(hours=1)
    assert settings.prune_interval == timedelta(0)
    defaults = Settings()
    assert (defaults.inbox_retention, defaults.dead_letter_retention) == (timedelta(days=7), timedelta(days=7))


@pytest.mark.heavy
def test_workers_prune_periodically_and_can_be_told_not_to(database_url: str, runtime: Runtime, conn) -> None:
    ping(runtime)
    age(conn, "pingpong.inbox", "processed_at", 8)
    quiet = Runtime(Settings(database_url=database_url, prune_interval=timedelta(0), **TEST_SETTINGS))  # type: ignore[arg-type]
    busy = Runtime(Settings(database_url=database_url, prune_interval=timedelta(seconds=0.1), **TEST_SETTINGS))  # type: ignore[arg-type]
    try:
        for rt, expected in ((quiet, 1), (busy, 0)):
            broker = StubBroker()
            tests_app.bind(broker, rt)
            worker = Worker(broker, worker_threads=1)
            worker.start()
            try:
                if expected:
                    threading.Event().wait(1.0)  # ten prune intervals of the other runtime
                    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox") == expected
                else:
                    wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.inbox") == 0, timeout=10)
            finally:
                worker.stop()
                broker.close()
    finally:
        quiet.close()
        busy.close()


def test_the_prune_command_dry_runs_and_prunes(database_url: str, runtime: Runtime, conn) -> None:
    from .integration.processes import service_env

    ping(runtime)
    age(conn, "pingpong.inbox", "processed_at", 8)
    env = service_env(database_url, "stub://")
    dry = run(env, "prune", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["pingpong"]["inbox"] == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox") == 1
    done = run(env, "prune", "--service", "pingpong")
    assert done.returncode == 0, done.stderr
    assert "pingpong" in done.stdout and "inbox" in done.stdout
    assert scalar(conn, "SELECT count(*) FROM pingpong.inbox") == 0
    bad = run({**env, "ESTAFETA_INBOX_RETENTION": "1d"}, "prune")
    assert bad.returncode == 2 and "ESTAFETA_INBOX_RETENTION" in bad.stderr
