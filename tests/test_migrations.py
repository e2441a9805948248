"""Migrations: the schema they build is the one the code expects; applying is idempotent and safe
from several processes at once."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import pq, sql

from estafeta import Runtime, Settings
from estafeta_actors.app import app as order_system
from estafeta_sql import migrate, queries, sagas

from .conftest import all_services
from .integration.processes import ROOT, service_env
from .services import scratch_database

SAGAS = {saga.name: saga for saga in order_system.sagas}

#: The columns operators and other tools query: their names are fixed.
OUTBOX_COLUMNS = {
    "id": "bigint", "message_id": "uuid", "queue_name": "text", "actor_name": "text", "message": "jsonb",
    "ordering_key": "text", "saga_id": "uuid", "created_at": "timestamp with time zone",
    "available_at": "timestamp with time zone", "attempts": "integer", "last_error": "text", "status": "text",
    "message_type": "text",
    "deferrals": "integer",
}  # fmt: skip
INBOX_COLUMNS = {"consumer": "text", "message_id": "uuid", "processed_at": "timestamp with time zone"}


def _columns(conn: psycopg.Connection[object], schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return {str(name): str(kind) for name, kind in rows}


def _primary_key(conn: psycopg.Connection[object], schema: str, table: str) -> list[str]:
    rows = conn.execute(
        """SELECT a.attname FROM pg_index i
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
           WHERE i.indrelid = format('%%I.%%I', %s::text, %s::text)::regclass AND i.indisprimary
           ORDER BY array_position(i.indkey, a.attnum)""",
        (schema, table),
    ).fetchall()
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize("service", [s.name for s in all_services()])
def test_every_service_gets_the_outbox_and_inbox_the_code_expects(service: str, schema_conn) -> None:
    assert _columns(schema_conn, service, "outbox") == OUTBOX_COLUMNS
    assert _columns(schema_conn, service, "inbox") == INBOX_COLUMNS
    assert _primary_key(schema_conn, service, "inbox") == ["consumer", "message_id"]


def _assert_prepares(conn: psycopg.Connection[object], name: str, query: bytes) -> None:
    text = query.decode()
    numbers: dict[str, int] = {}
    server_text = re.sub(r"%\((\w+)\)s", lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}", text)
    result = conn.pgconn.prepare(f"check_{name}".encode(), server_text.encode())
    assert result.status == pq.ExecStatus.COMMAND_OK, result.error_message.decode()


@pytest.mark.parametrize("service", [s.name for s in all_services()])
@pytest.mark.parametrize("name", queries.names())
def test_every_named_query_compiles_against_the_migrated_schema(service: str, name: str, schema_conn) -> None:
    _assert_prepares(schema_conn, name, queries.query(name, service))


@pytest.mark.parametrize("saga", sorted(SAGAS))
@pytest.mark.parametrize("name", sagas.names())
def test_every_saga_query_compiles_against_the_saga_tables(saga: str, name: str, schema_conn) -> None:
    _assert_prepares(schema_conn, name, sagas.query(name, SAGAS[saga].table))


def test_applying_twice_applies_nothing_the_second_time(database_url: str) -> None:
    runtime = Runtime(Settings(database_url=database_url))
    try:
        assert all(names == [] for names in runtime.migrate(all_services()).values())
        assert all(names == [] for names in runtime.migrate(all_services(), check=True).values())
    finally:
        runtime.close()


@pytest.mark.heavy
def test_services_can_live_in_separate_databases() -> None:
    with scratch_database() as main_dsn, scratch_database() as pingpong_dsn:
        runtime = Runtime(Settings(database_url=main_dsn, service_database_urls={"pingpong": pingpong_dsn}))
        try:
            order_system.migrate(runtime)
        finally:
            runtime.close()
        with psycopg.connect(pingpong_dsn) as conn:
            assert _columns(conn, "pingpong", "pings")
        with psycopg.connect(main_dsn) as conn:
            assert _columns(conn, "pingpong", "pings") == {}


def _estafeta(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estafeta_cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.heavy
def test_check_exits_1_while_pending_and_four_migrators_at_once_apply_each_file_once() -> None:
    with scratch_database() as dsn:
        env = service_env(dsn, "stub://")
        pending = _estafeta(env, "migrate", "--check")
        assert pending.returncode == 1, pending.stderr
        assert "pingpong: pending" in pending.stdout

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: _estafeta(env, "migrate"), range(4)))
        assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]

        assert _estafeta(env, "migrate", "--check").returncode == 0
        with psycopg.connect(dsn) as conn:
            for service in order_system.services:
                query = sql.SQL("SELECT name FROM {}.schema_migrations").format(sql.Identifier(service.name))
                names = conn.execute(query).fetchall()
                assert sorted(n for (n,) in names) == sorted(m.name for m in service.migrations())


def test_a_saga_table_made_before_the_list_indexes_gets_them_from_its_second_migration() -> None:
    order = SAGAS["order"]
    first, second, third, *later = order.migrations()
    assert (first.name, second.name) == ("saga_order/0001_tables.sql", "saga_order/0002_list_indexes.sql")
    assert third.name == "saga_order/0003_ended_index.sql"
    since = [second.name, third.name, *(m.name for m in later)]
    with scratch_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        # A database migrated by the release before: the saga table, its first migration only.
        migrate.apply(conn, "orders", [first])
        assert migrate.pending(conn, "orders", order.migrations()) == since
        assert migrate.apply(conn, "orders", order.migrations()) == since
        indexes = {
            str(name): str(definition)
            for name, definition in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'orders' AND tablename = 'saga_order'"
            ).fetchall()
        }
    assert indexes["saga_order_newest"].endswith("(started_at, saga_id)")
    assert indexes["saga_order_status_newest"].endswith("(status, started_at, saga_id)")
    assert indexes["saga_order_step_newest"].endswith("(current_step, started_at, saga_id)")
    assert "saga_order_started_at" not in indexes  # the first index serves what it did
    assert indexes["saga_order_ended"].endswith(
        "(completed_at) WHERE (status = ANY (ARRAY['completed'::text, 'compensated'::text]))"
    )


def test_a_saga_table_made_before_gave_up_takes_the_status_and_its_sagas_failed_for_want_of_replies() -> None:
    # A database of the release before: sagas the watchdog failed for want of replies are
    # `failed`, and the status CHECK refuses `gave_up`. The migration gives those sagas the
    # new status (so that a late answer still moves them on), and only those.
    order = SAGAS["order"]
    before = [m for m in order.migrations() if m.name <= "saga_order/0003_ended_index.sql"]
    assert [m.name for m in order.migrations()][len(before)] == "saga_order/0004_gave_up.sql"
    undo = ["charge_payment"]
    rows = {
        "confirm": ("failed", "confirm_order", None, "confirm_order: no reply after 3 attempt(s)"),
        "refund": ("failed", "charge_payment", undo, "compensation charge_payment: no reply after 3 attempt(s)"),
        "refused": ("failed", "charge_payment", undo, "compensation charge_payment refused: gone"),
        "broken": ("failed", "confirm_order", None, "watchdog: SagaStuck: no step 'x'"),
        "done": ("completed", "notify_customer", None, None),
    }  # fmt: skip
    ids = {name: uuid.uuid4() for name in rows}
    insert = (
        "INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, compensations,"
        " step_timeout, last_error, version) VALUES (%s, %s, %s, %s, '{}', %s, '30 s', %s, 4)"
    )
    with scratch_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        migrate.apply(conn, "orders", before)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, (uuid.uuid4(), uuid.uuid4(), "gave_up", "confirm_order", None, None))
        for name, (status, step, plan, error) in rows.items():
            conn.execute(insert, (ids[name], uuid.uuid4(), status, step, plan, error))
        assert migrate.apply(conn, "orders", order.migrations()) == ["saga_order/0004_gave_up.sql"]
        found = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT saga_id, status, version FROM orders.saga_order")}
        conn.execute(insert, (uuid.uuid4(), uuid.uuid4(), "gave_up", "confirm_order", None, None))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, (uuid.uuid4(), uuid.uuid4(), "lost", "confirm_order", None, None))
    statuses = {name: found[ids[name]] for name in rows}
    assert statuses == {
        "confirm": ("gave_up", 4), "refund": ("gave_up", 4), "refused": ("failed", 4), "broken": ("failed", 4),
        "done": ("completed", 4),
    }  # fmt: skip
