"""Scratch databases for test runs: one created per run, its service schemas emptied between tests.

What estafeta's pytest plugin (``estafeta.testing``) and estafeta's own suite use.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import conninfo, sql

#: Empties the tables of the services' schemas that a test wrote to, in one round trip: TRUNCATE
#: (which fires no row trigger, so append-only tables empty too) of every table that has a row or
#: whose sequence was used, RESTART IDENTITY, so ids start at 1 again as after a TRUNCATE of every table.
#: Truncating only those is what keeps it cheap: a TRUNCATE of all ~100 tables takes 0.5-2 s, this
#: takes milliseconds when a test wrote to a few. Each table is checked exactly (a row, or a
#: sequence's last_value), never through the statistics views, which lag.
_WIPE = """
DO $wipe$
DECLARE
    target regclass;
    written boolean;
    targets text[] := '{{}}';
BEGIN
    -- The tables whose identity or serial sequence was used (pg_sequences reads each sequence once).
    SELECT coalesce(array_agg(DISTINCT d.refobjid::regclass::text), '{{}}') INTO targets
    FROM pg_sequences q
    JOIN pg_class s ON s.relname = q.sequencename AND s.relkind = 'S'
    JOIN pg_namespace sn ON sn.oid = s.relnamespace AND sn.nspname = q.schemaname
    JOIN pg_depend d ON d.objid = s.oid AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
    JOIN pg_class t ON t.oid = d.refobjid AND t.relname <> 'schema_migrations'
    WHERE q.schemaname = ANY({schemas}) AND q.last_value IS NOT NULL;
    -- And the tables that have a row.
    FOR target IN
        SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY({schemas}) AND c.relkind IN ('r', 'p') AND c.relname <> 'schema_migrations'
    LOOP
        IF NOT target::text = ANY(targets) THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', target) INTO written;
            IF written THEN
                targets := targets || target::text;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(targets) > 0 THEN
        EXECUTE format('TRUNCATE %s RESTART IDENTITY CASCADE', array_to_string(targets, ', '));
    END IF;
END
$wipe$
"""


def wipe(dsn: str, schemas: Sequence[str]) -> None:
    """Empty every table of ``schemas`` (but their migration records), identities restarted."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(_WIPE).format(schemas=sql.Literal(list(schemas))))


@contextmanager
def scratch_database(admin_dsn: str = "") -> Iterator[str]:
    """A new, empty database on ``admin_dsn``'s server, dropped afterwards; yields its DSN.

    ``admin_dsn`` (any database the user may connect to and create databases from; empty:
    libpq's environment and defaults) is only used to create and drop it.
    """
    name = f"estafeta_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield conninfo.make_conninfo(admin_dsn, dbname=name)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
