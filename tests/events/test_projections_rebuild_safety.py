"""A rebuild never loses a read model: long names, objects built on the read model, a retried switch-over."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

from estafeta.events.projection_ops import RebuildError, projection_status, rebuild
from estafeta.events.projections import Projector, rebuild_schema
from estafeta.events.store import EventStore
from estafeta_sql import event_store

from ..helpers import wait_until
from .support import EventSchema
from .test_projections import catch_up, deposit
from .workload import Totals, registry, totals_ddl, totals_of, truth


def long_totals(size: int) -> Totals:
    """``Totals`` in a table whose name is ``size`` bytes, with an index and a constraint named after it."""
    table = ("totals_" + "x" * size)[:size]
    ddl = (
        totals_ddl(table)
        + f"; CREATE INDEX ON {{{table}}} (amount); ALTER TABLE {{{table}}} ADD UNIQUE (stream_id, last_version)"
    )
    cls = type("LongTotals", (Totals,), {"name": f"long_{size}", "tables": {table: ddl}, "table": table})
    return cls()  # type: ignore[no-any-return]


def names_on(conn: psycopg.Connection[Any], schema: str, table: str) -> tuple[list[str], list[str]]:
    """The table's index names and constraint names."""
    qualified = sql.Identifier(schema, table).as_string(None)
    indexes = conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", [qualified])
    constraints = conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass", (qualified,))
    return sorted(r[0] for r in indexes.fetchall()), sorted(r[0] for r in constraints.fetchall())


def schemas(conn: psycopg.Connection[Any], prefix: str) -> list[str]:
    rows = conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)).fetchall()
    return sorted(r[0] for r in rows)


def test_a_table_name_postgresql_would_truncate_is_refused_when_the_projection_is_declared() -> None:
    with pytest.raises(ValueError, match=r"^projection too_long: table name '(x){64}' is 64 bytes, and PostgreSQL"):

        class TooLong(Totals):
            name = "too_long"
            tables: ClassVar[dict[str, str]] = {"x" * 64: totals_ddl("x" * 64)}

    with pytest.raises(ValueError, match="is 64 bytes"):  # bytes, not characters
        type("Accented", (Totals,), {"name": "accented", "tables": {"é" * 32: "CREATE TABLE {t} ()"}})


@pytest.mark.parametrize("size", [55, 62, 63])
def test_a_rebuild_of_a_long_named_table_keeps_it_and_its_index_names(
    event_schema: EventSchema, conn: psycopg.Connection[Any], size: int
) -> None:
    store = EventStore(event_schema.schema, registry)
    projection = long_totals(size)
    [table] = projection.tables
    for i in range(5):
        deposit(conn, store, f"acct-{i % 2}", i + 1)
    live = Projector(projection, store)
    live.create_tables(conn)
    assert catch_up(conn, live) == 5
    before = names_on(conn, store.schema, table)
    result = rebuild(event_schema.dsn, projection, store)
    [status] = projection_status(conn, store.schema)
    assert status.events_applied == result.events_applied
    catch_up(conn, live)  # whatever another suite's open transaction held back from the rebuild
    assert totals_of(conn, store.schema, table) == truth(conn, store.schema)
    [status] = projection_status(conn, store.schema)
    assert (status.name, status.position, status.events_applied) == (projection.name, 5, 5)
    assert names_on(conn, store.schema, table) == before, "indexes and constraints named as the DDL names them"
    assert schemas(conn, rebuild_schema(store.schema, projection.name)) == [], "the copy's schema is gone"


@pytest.mark.parametrize("when", ["before the rebuild", "during the rebuild"])
def test_a_rebuild_refuses_to_drop_what_users_built_on_the_read_model(
    event_schema: EventSchema, conn: psycopg.Connection[Any], when: str
) -> None:
    store = EventStore(event_schema.schema, registry)
    schema = sql.Identifier(store.schema)
    deposit(conn, store, "acct-1", 7, 8)
    live = Projector(Totals(), store)
    live.create_tables(conn)
    catch_up(conn, live)
    before = totals_of(conn, store.schema, "totals")

    def build_on_it(*_: int) -> None:
        conn.execute(sql.SQL("CREATE VIEW {}.big AS SELECT * FROM {}.totals WHERE amount > 10").format(schema, schema))
        conn.execute(
            sql.SQL("CREATE TABLE {}.notes (stream_id text REFERENCES {}.totals, note text)").format(schema, schema)
        )

    if when == "before the rebuild":
        build_on_it()
    with pytest.raises(RebuildError) as refused:
        rebuild(event_schema.dsn, Totals(), store, progress=build_on_it if when == "during the rebuild" else None)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("rebuild of totals refused")
    assert f"view {store.schema}.big depends on" in message and "constraint notes_stream_id_fkey" in message
    assert "drop them, rebuild, then create them again" in message
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.big").format(schema)).fetchone() == (1,)
    assert totals_of(conn, store.schema, "totals") == before, "the live read model is untouched"
    [status] = projection_status(conn, store.schema)
    assert (status.name, status.events_applied) == ("totals", 2), "no checkpoint of the copy is left"
    assert schemas(conn, rebuild_schema(store.schema, "totals")) == []


class ReleaseAfterFirstAttempt(logging.Handler):
    """Ends the reader's transaction once the switch-over has logged a lock timeout."""

    def __init__(self, reader: psycopg.Connection[Any]) -> None:
        super().__init__()
        self.reader = reader

    def emit(self, record: logging.LogRecord) -> None:
        if "switch-over attempt 1 waited too long" in record.getMessage():
            self.reader.commit()


def test_a_rolled_back_switch_over_attempt_is_not_counted(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    deposit(conn, store, "acct-1", 1, 2, 3)
    live = Projector(Totals(), store)
    live.create_tables(conn)
    catch_up(conn, live)
    reader = event_schema.connect(autocommit=False)
    handler = ReleaseAfterFirstAttempt(reader)
    ops_logger = logging.getLogger("estafeta.events.projection_ops")
    ops_logger.addHandler(handler)

    def late_events_and_a_reader(done: int, total: int) -> None:
        # After the copy's last batch: events for the switch-over to apply, then a reader
        # holding the live table past the lock timeout, so that the first attempt rolls back.
        deposit(conn, store, "acct-2", 4, 5)
        # Another suite's open transaction may hold them back: wait until the switch-over can read them.
        wait_until(lambda: not event_store.held_back(conn, store.schema, after=(0, 0)), 120, what="the late events")
        reader.execute(sql.SQL("SELECT count(*) FROM {}.totals").format(sql.Identifier(store.schema)))

    try:
        result = rebuild(event_schema.dsn, Totals(), store, progress=late_events_and_a_reader, lock_timeout=0.2)
    finally:
        ops_logger.removeHandler(handler)
        reader.close()
    assert result.attempts >= 2, "the first attempt waited for the reader and rolled back"
    [status] = projection_status(conn, store.schema)
    assert (status.events_applied, status.lag_events) == (5, 0), "the switch-over applied the late events"
    assert result.events_applied == 5, "each event counted once, as the checkpoint counts it"
    assert totals_of(conn, store.schema, "totals") == truth(conn, store.schema)


class NumberedTotals(Totals):
    """``Totals`` with a sequence of its own, which another table may borrow."""

    tables: ClassVar[dict[str, str]] = {
        "totals": totals_ddl("totals").replace("DEFAULT 0)", "DEFAULT 0, id bigserial)")
    }


def test_a_dependent_only_postgresql_sees_stops_the_switch_over_too(
    event_schema: EventSchema, conn: psycopg.Connection[Any]
) -> None:
    store = EventStore(event_schema.schema, registry)
    schema = sql.Identifier(store.schema)
    deposit(conn, store, "acct-1", 7)
    live = Projector(NumberedTotals(), store)
    live.create_tables(conn)
    catch_up(conn, live)
    # A default that draws from the table's sequence depends on the sequence, not the table:
    # only DROP TABLE (without CASCADE, which would silently take the default away) sees it.
    sequence = sql.Literal(f"{store.schema}.totals_id_seq")
    conn.execute(sql.SQL("CREATE TABLE {}.tickets (n bigint DEFAULT nextval({}))").format(schema, sequence))
    with pytest.raises(RebuildError, match=r"default value for column n of table .*tickets depends on sequence"):
        rebuild(event_schema.dsn, NumberedTotals(), store)
    assert conn.execute(sql.SQL("INSERT INTO {}.tickets DEFAULT VALUES RETURNING n").format(schema)).fetchone()
    assert totals_of(conn, store.schema, "totals") == truth(conn, store.schema)
    assert schemas(conn, rebuild_schema(store.schema, "totals")) == []
