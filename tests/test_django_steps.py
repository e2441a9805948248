"""A Django project's step: the ORM on Django's connection of the thread, which is the step's own transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from estafeta import App, Runtime, Service, Settings, StepContext
from estafeta.steps.delivery import deliver
from estafeta.steps.outcome import Outcome
from estafeta_sql import inbox
from examples.shelf import ItemAdded, Restock

from .conftest import TEST_SETTINGS
from .helpers import message_for, scalar, wait_until

# The shelf's schema, seen by a Django project: a step of its own on the shelf service.
shelf = Service("shelf", migrations=Path(__file__).parents[1] / "examples" / "shelf" / "migrations" / "shelf")
committed: list[uuid.UUID] = []


@shelf.step(Restock, name="restock_in_django")
def restock_in_django(ctx: StepContext, command: Restock) -> None:
    from django.db import connection, transaction
    from django.db.models import F

    from examples.shelf_django.models import Item

    assert ctx.conn is connection.connection  # the step's transaction is on Django's connection
    Item.objects.filter(item_id=command.item_id).update(quantity=F("quantity") + command.quantity)
    with transaction.atomic():  # a savepoint in the step's transaction; select_for_update needs one
        item = Item.objects.select_for_update().get(item_id=command.item_id)
        transaction.on_commit(lambda: committed.append(command.item_id))
    ctx.publish(ItemAdded(item.item_id, item.name))
    if command.quantity == 13:  # an unlucky number: fails after its writes
        raise RuntimeError("after the ORM write and the outbox row")


@shelf.step(ItemAdded, name="note_item")
def note_item(ctx: StepContext, event: ItemAdded) -> None:
    """A subscriber of ``ItemAdded``: the restock's outbox row is its message."""


app = App("shelf_django", services=[shelf])


@pytest.fixture
def django_steps(django_project: None, database_url: str, runtime: Runtime) -> Iterator[Runtime]:
    """A runtime whose steps run on Django's connection of the thread."""
    from django.db import connections

    from estafeta import django as es

    committed.clear()
    connections.close_all()
    # A worker keeps its connection from step to step (Django's default, 0, closes it after each).
    settings_dict = connections["default"].settings_dict
    max_age = settings_dict["CONN_MAX_AGE"]
    settings_dict["CONN_MAX_AGE"] = None
    steps = Runtime(Settings(database_url=database_url, **TEST_SETTINGS), step_connections=es.step_connections())  # type: ignore[arg-type]
    yield steps
    steps.close()
    connections.close_all()
    settings_dict["CONN_MAX_AGE"] = max_age


def an_item(conn: Any) -> uuid.UUID:
    item_id = uuid.uuid4()
    conn.execute("INSERT INTO shelf.items (item_id, name, quantity) VALUES (%s, %s, 0)", (item_id, f"bolts {item_id}"))
    return item_id


def clients(conn: Any) -> int:
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    return int(scalar(conn, query))


def state(conn: Any, item_id: uuid.UUID) -> tuple[int, int, int]:
    return (
        scalar(conn, "SELECT quantity FROM shelf.items WHERE item_id = %s", item_id),
        scalar(conn, "SELECT count(*) FROM shelf.inbox"),
        scalar(conn, "SELECT count(*) FROM shelf.outbox"),
    )


def test_the_orm_write_the_inbox_row_and_the_outbox_row_commit_together_and_once(django_steps, conn) -> None:
    from django.db import connection, transaction

    connection.ensure_connection()
    notices: list[str | None] = []
    connection.connection.add_notice_handler(lambda notice: notices.append(notice.message_primary))
    item_id = an_item(conn)
    message = message_for("shelf.restock_in_django", Restock(item_id, 3))
    assert deliver(restock_in_django, django_steps, message) is Outcome.OK
    assert state(conn, item_id) == (3, 1, 1)
    assert committed == [item_id]  # on_commit ran, after the commit
    # A duplicate delivery changes nothing.
    assert deliver(restock_in_django, django_steps, message) is Outcome.DUPLICATE
    assert state(conn, item_id) == (3, 1, 1)
    assert committed == [item_id]
    # Django is as it was: autocommit on, its connection usable by the ORM.
    assert transaction.get_autocommit() and not connection.in_atomic_block
    assert connection.connection.info.transaction_status.name == "IDLE"
    assert notices == []  # no "there is already a transaction in progress" in the server's log


def test_a_failure_after_the_orm_write_rolls_back_the_write_the_inbox_row_and_the_outbox_row(
    django_steps, conn
) -> None:
    from django.db import transaction

    from examples.shelf_django.models import Item

    item_id = an_item(conn)
    with pytest.raises(RuntimeError, match="after the ORM write"):
        deliver(restock_in_django, django_steps, message_for("shelf.restock_in_django", Restock(item_id, 13)))
    assert state(conn, item_id) == (0, 0, 0)
    assert committed == []  # no on_commit for a rollback
    assert transaction.get_autocommit()
    assert Item.objects.get(item_id=item_id).quantity == 0  # the ORM goes on working on that connection


def test_a_step_in_another_database_than_djangos_is_refused(django_steps, conn) -> None:
    from estafeta import django as es

    from .services import scratch_database

    with scratch_database() as other:
        elsewhere = Runtime(Settings(database_url=other, **TEST_SETTINGS), step_connections=es.step_connections())  # type: ignore[arg-type]
        item_id = an_item(conn)
        message = message_for("shelf.restock_in_django", Restock(item_id, 1))
        with pytest.raises(es.OtherDatabase, match="could not write in the step's transaction"):
            deliver(restock_in_django, elsewhere, message)
        elsewhere.close()
    assert state(conn, item_id) == (0, 0, 0)


def test_djangos_database_named_another_way_is_the_steps(django_steps, conn, database_url: str) -> None:
    import psycopg

    from estafeta import django as es

    # Django says 127.0.0.1; estafeta's URL names the same server by its name.
    by_name = psycopg.conninfo.make_conninfo(database_url, host="localhost")
    runtime = Runtime(Settings(database_url=by_name, **TEST_SETTINGS), step_connections=es.step_connections())  # type: ignore[arg-type]
    item_id = an_item(conn)
    assert (
        deliver(restock_in_django, runtime, message_for("shelf.restock_in_django", Restock(item_id, 1))) is Outcome.OK
    )
    runtime.close()
    assert state(conn, item_id) == (1, 1, 1)


def test_worker_threads_each_run_their_steps_on_their_own_django_connection(django_steps, conn) -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from estafeta import django as es

    broker = StubBroker()
    broker.emit_after("process_boot")
    app.bind(broker, django_steps)
    broker.add_middleware(es.CloseConnections())
    items = [an_item(conn) for _ in range(8)]
    messages = [message_for("shelf.restock_in_django", Restock(item_id, 2)) for item_id in items]
    failing = message_for("shelf.restock_in_django", Restock(items[0], 13), max_retries=0)
    before = clients(conn)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    try:
        for message in [*messages, *messages, failing]:  # each twice: a duplicate delivery
            broker.enqueue(message)
        broker.join("shelf", timeout=60_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
    assert scalar(conn, "SELECT array_agg(DISTINCT quantity) FROM shelf.items") == [2]
    # The failing delivery rolled back its write and its outbox row, and was dead-lettered (its inbox row).
    assert scalar(conn, "SELECT count(*) FROM shelf.inbox") == 9
    assert [letter["message_id"] for letter in inbox.list_dead_letters(conn, "shelf")] == [failing.message_id]
    assert scalar(conn, "SELECT count(*) FROM shelf.outbox") == 8
    assert sorted(committed) == sorted(items)
    # The threads' connections were closed as they stopped: with estafeta's pool closed too (the
    # dead letter was written on it), the database is back to its clients before.
    django_steps.close()
    wait_until(lambda: clients(conn) == before, timeout=30, what="the worker threads' connections closed")


def test_a_worker_whose_django_closes_its_connection_after_each_step_is_warned_once(django_steps, conn, caplog) -> None:
    from django.db import connections

    from estafeta import django as es

    settings_dict = connections["default"].settings_dict
    settings_dict["CONN_MAX_AGE"] = 0  # Django's default: a connection per request, here per step
    es._warned_max_age.discard("default")
    items = [an_item(conn) for _ in range(2)]
    for item_id in items:
        deliver(restock_in_django, django_steps, message_for("shelf.restock_in_django", Restock(item_id, 1)))
    warned = [r.getMessage() for r in caplog.records if "CONN_MAX_AGE" in r.getMessage()]
    assert len(warned) == 1 and "every step opens a new connection" in warned[0]
    assert scalar(conn, "SELECT sum(quantity) FROM shelf.items") == 2  # and the steps still work
