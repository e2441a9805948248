"""The eventsourcing library's side of ``bench.events``: its PostgreSQL recorder and application, on the same server."""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
from psycopg import conninfo


def settings_for(dsn: str, schema: str) -> dict[str, Any]:
    """``PostgresDatastore`` keyword arguments for the scratch database ``dsn``, tables in ``schema``."""
    params = conninfo.conninfo_to_dict(dsn)
    return {
        "dbname": params["dbname"],
        "host": params.get("host", "127.0.0.1"),
        "port": params.get("port", 5432),
        "user": params.get("user", "postgres"),
        "password": params.get("password", ""),
        "schema": schema,
    }


def create_recorder_tables(dsn: str, schema: str) -> None:
    """Create the schema and eventsourcing's application recorder tables in it."""
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    datastore = PostgresDatastore(**settings_for(dsn, schema))
    PostgresApplicationRecorder(datastore).create_table()
    datastore.close()


def catch_up_read(dsn: str, schema: str, limit: int, page: int = 1000) -> float:
    """Events per second reading the notification log from the start with ``select_notifications``."""
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    datastore = PostgresDatastore(**settings_for(dsn, schema))
    recorder = PostgresApplicationRecorder(datastore)
    began, read, last = time.perf_counter(), 0, 0
    while read < limit:
        notifications = recorder.select_notifications(start=last, limit=page, inclusive_of_start=False)
        if not notifications:
            break
        read, last = read + len(notifications), notifications[-1].id
    elapsed = time.perf_counter() - began
    datastore.close()
    return read / elapsed


def aggregate_load(dsn: str, schema: str, events: int, loads: int) -> tuple[float, float]:
    """p50 ms of loading one aggregate of ``events`` events with an eventsourcing Application: (snapshots, none)."""
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class Cart(Aggregate):
        def __init__(self) -> None:
            self.items = 0

        @event("ItemAdded")
        def add_item(self, sku: str, quantity: int) -> None:
            self.items += quantity

    settings = settings_for(dsn, schema)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": settings["dbname"],
        "POSTGRES_HOST": str(settings["host"]),
        "POSTGRES_PORT": str(settings["port"]),
        "POSTGRES_USER": settings["user"],
        "POSTGRES_PASSWORD": settings["password"],
        "POSTGRES_SCHEMA": schema,
        "IS_SNAPSHOTTING_ENABLED": "y",
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    app: Application[Any] = Application(env=env)
    cart = Cart()
    for start in range(0, events, 100):
        for _ in range(min(100, events - start)):
            cart.add_item("sku-42", 3)
        app.save(cart)
    app.take_snapshot(cart.id)
    with_snapshots = _p50(lambda: app.repository.get(cart.id), loads)
    # The same tables, without a snapshot store: every load replays.
    replaying: Application[Any] = Application(env={**env, "IS_SNAPSHOTTING_ENABLED": "no"})
    without = _p50(lambda: replaying.repository.get(cart.id), max(3, loads // 20))
    app.close()
    replaying.close()
    return with_snapshots, without


def _p50(load: Any, times: int) -> float:
    samples = []
    for _ in range(times):
        began = time.perf_counter()
        load()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)
