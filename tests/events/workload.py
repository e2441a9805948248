"""A concurrent event workload and the projection that totals it (stress, kill and rebuild tests).

Writers append ``Deposited`` events to random streams with random rollbacks and sleeps
inside open transactions (after their positions were drawn), so positions commit out of
order. ``Totals`` keeps, per stream, the number of events, their sum, the last version and
how many events arrived out of version order: compared with what committed (``truth``),
any skipped, repeated or reordered event shows.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import psycopg
from psycopg import sql

from estafeta.events.event_types import EventRegistry
from estafeta.events.projections import Projection, ProjectionContext, handles
from estafeta.events.store import ANY, ConcurrencyConflict, EventStore, RecordedEvent

registry = EventRegistry()


@registry.event("Deposited")
@attrs.frozen
class Deposited:
    amount: int


def totals_ddl(table: str) -> str:
    """The DDL of a totals table named ``{table}`` (a placeholder the projector fills in)."""
    return (
        f"CREATE TABLE {{{table}}} (stream_id text PRIMARY KEY, events bigint NOT NULL, amount bigint NOT NULL,"
        " last_version bigint NOT NULL, out_of_order bigint NOT NULL DEFAULT 0)"
    )


class Totals(Projection):
    """Per stream: events, their sum, the last version, and versions that did not follow the previous one."""

    name = "totals"
    tables: ClassVar[dict[str, str]] = {"totals": totals_ddl("totals")}
    #: The table the handler writes (subclasses with other names point it at theirs).
    table: ClassVar[str] = "totals"
    #: Seconds to sleep per event (the kill test makes batches slow so that it kills mid-batch).
    delay: ClassVar[float] = 0.0

    @handles(Deposited)
    def deposited(self, ctx: ProjectionContext, recorded: RecordedEvent[Deposited]) -> None:
        if self.delay:
            time.sleep(self.delay)
        statement = sql.SQL(
            "INSERT INTO {t} AS t (stream_id, events, amount, last_version) VALUES (%s, 1, %s, %s)"
            " ON CONFLICT (stream_id) DO UPDATE SET events = t.events + 1, amount = t.amount + excluded.amount,"
            " last_version = excluded.last_version,"
            " out_of_order = t.out_of_order + (excluded.last_version <> t.last_version + 1)::int"
        ).format(t=ctx.table(self.table))
        ctx.conn.execute(statement, (recorded.stream_id, recorded.event.amount, recorded.version))


class BatchTotals(Totals):
    """``Totals`` applied a batch at a time: one statement per batch (the fast way to write a projection)."""

    name = "batch_totals"
    tables: ClassVar[dict[str, str]] = {"batch_totals": totals_ddl("batch_totals")}
    table = "batch_totals"
    event_types = (Deposited,)

    def apply_batch(self, ctx: ProjectionContext, events: Sequence[RecordedEvent[Any]]) -> None:
        folded: dict[str, list[int]] = {}  # stream -> [events, amount, last version, out of order]
        for recorded in events:
            row = folded.setdefault(recorded.stream_id, [0, 0, recorded.version - 1, 0])
            row[3] += recorded.version != row[2] + 1
            row[0], row[1], row[2] = row[0] + 1, row[1] + recorded.event.amount, recorded.version
        statement = sql.SQL(
            "INSERT INTO {t} AS t (stream_id, events, amount, last_version, out_of_order)"
            " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[])"
            " ON CONFLICT (stream_id) DO UPDATE SET events = t.events + excluded.events,"
            " amount = t.amount + excluded.amount, last_version = excluded.last_version,"
            " out_of_order = t.out_of_order + excluded.out_of_order"
            " + (excluded.last_version - excluded.events <> t.last_version)::int"
        ).format(t=ctx.table(self.table))
        columns = list(zip(*([stream, *row] for stream, row in folded.items()), strict=True))
        ctx.conn.execute(statement, [list(column) for column in columns])


def totals_of(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, tuple[int, int, int, int]]:
    """``{stream: (events, amount, last_version, out_of_order)}`` of a totals table."""
    query = sql.SQL("SELECT stream_id, events, amount, last_version, out_of_order FROM {}").format(
        sql.Identifier(schema, table)
    )
    return {row[0]: tuple(row[1:]) for row in conn.execute(query).fetchall()}  # type: ignore[misc]


def truth(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[int, int, int, int]]:
    """The same totals computed from the committed events themselves."""
    query = sql.SQL(
        "SELECT stream_id, count(*), sum((data->>'amount')::bigint), max(version), 0 FROM {}.events GROUP BY stream_id"
    ).format(sql.Identifier(schema))
    return {row[0]: tuple(row[1:]) for row in conn.execute(query).fetchall()}  # type: ignore[misc]


def write(
    dsn: str, schema: str, *, seed: int, events: int, streams: int = 300, rollback: float = 0.1, sleep: float = 0.05
) -> tuple[int, int]:
    """Commit at least ``events`` events; return ``(committed events, rolled back transactions)``."""
    rng = random.Random(seed)
    store = EventStore(schema, registry)
    committed = rolled_back = 0
    with psycopg.connect(dsn) as conn:
        while committed < events:
            count = 0
            try:
                for _ in range(2 if rng.random() < 0.1 else 1):
                    batch = [Deposited(rng.randint(1, 1000)) for _ in range(rng.randint(1, 8))]
                    store.append(conn, f"acct-{rng.randrange(streams)}", batch, expected_version=ANY)
                    count += len(batch)
                if rng.random() < sleep:
                    time.sleep(rng.uniform(0.002, 0.03))  # inside the open transaction, positions drawn
                if rng.random() < rollback:
                    conn.rollback()
                    rolled_back += 1
                    continue
                conn.commit()
                committed += count
            except ConcurrencyConflict:
                conn.rollback()
                rolled_back += 1
    return committed, rolled_back


def main() -> None:
    """``python -m tests.events.workload DSN SCHEMA --seed N --events N``: one writer process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--events", type=int, default=1000)
    args = parser.parse_args()
    committed, rolled_back = write(args.dsn, args.schema, seed=args.seed, events=args.events)
    print(f"{committed} {rolled_back}")


if __name__ == "__main__":
    main()
