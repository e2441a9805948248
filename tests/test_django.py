"""estafeta in Django: the ORM's writes and estafeta's rows in one ``transaction.atomic()`` block."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import django
import psycopg
import pytest

from estafeta import HttpResponse, IdempotentRequest, Runtime
from examples.shelf import ItemAdded, Restock, Stocking, idempotency, shelf, stocking, store

from .helpers import scalar, wait_until
from .test_sqlalchemy import counts


@pytest.fixture
def dj(django_project: None, runtime: Runtime) -> Iterator[Any]:
    """Django's ``es`` module with the database emptied; Django's connections closed after the test."""
    from django.db import connections

    from estafeta import django as es

    yield es
    connections.close_all()


def write_everything(es: Any, item_id: uuid.UUID) -> None:
    from examples.shelf_django.models import Item

    Item.objects.create(item_id=item_id, name=f"item {item_id}")
    es.send(shelf, Restock(item_id, 1))
    es.publish(shelf, ItemAdded(item_id, "x"))
    es.start_saga(stocking, Stocking(item_id, 2))
    es.append_events(store, f"item-{item_id}", [ItemAdded(item_id, "x")])


def test_the_models_write_and_every_producer_row_commit_together_in_atomic(dj, conn) -> None:
    from django.db import transaction

    with transaction.atomic():
        write_everything(dj, uuid.uuid4())
    assert counts(conn) == (1, 3, 1, 1)


def test_an_exception_in_atomic_rolls_back_the_model_and_every_producer_row(dj, conn) -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError, match="after the writes"), transaction.atomic():
        write_everything(dj, uuid.uuid4())
        raise RuntimeError("after the writes")
    assert counts(conn) == (0, 0, 0, 0)


def test_a_nested_atomic_rolled_back_takes_only_its_own_rows(dj, conn) -> None:
    from django.db import transaction

    from examples.shelf_django.models import Item

    with transaction.atomic():
        Item.objects.create(item_id=uuid.uuid4(), name="kept")
        dj.send(shelf, Restock(uuid.uuid4(), 1))
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            dj.send(shelf, Restock(uuid.uuid4(), 2))
            _ = 1 / 0
    sent = [row[0] for row in conn.execute("SELECT message->'args'->0->>'quantity' FROM shelf.outbox")]
    assert (counts(conn)[0], sent) == (1, ["1"])


def test_outside_atomic_is_refused_clearly_as_django_does(dj, conn) -> None:
    from django.db.transaction import TransactionManagementError

    with pytest.raises(TransactionManagementError, match=r"not inside transaction\.atomic\(\)"):
        dj.send(shelf, Restock(uuid.uuid4(), 1))
    assert counts(conn)[1] == 0


def test_a_message_sent_in_a_view_reaches_its_step_through_the_relay(
    dj, conn, stub_broker, stub_worker, running_relay
) -> None:
    from django.db import transaction

    from examples.shelf_django.models import Item

    item_id = uuid.uuid4()
    with transaction.atomic():
        Item.objects.create(item_id=item_id, name="bolts")
        dj.send(shelf, Restock(item_id, 6))
    wait_until(lambda: scalar(conn, "SELECT quantity FROM shelf.items") == 6, what="the restock step")


def test_idempotency_in_django_keeps_one_effect_and_replays(dj, conn) -> None:
    from django.db import transaction
    from django.db.transaction import TransactionManagementError

    from examples.shelf_django.models import Item

    calls = []

    def place() -> HttpResponse:
        calls.append(1)
        item_id = uuid.uuid4()
        Item.objects.create(item_id=item_id, name="washers")
        dj.send(shelf, Restock(item_id, 1))
        return HttpResponse(201, (), str(item_id).encode())

    def boom() -> HttpResponse:
        Item.objects.create(item_id=uuid.uuid4(), name="gaskets")
        dj.send(shelf, Restock(uuid.uuid4(), 1))
        raise RuntimeError("after the writes")

    request = IdempotentRequest("client-1", "k1", "POST", "/items", b"{}", "application/json")
    first = dj.run_idempotent(idempotency, request, place)
    again = dj.run_idempotent(idempotency, request, place)
    with pytest.raises(RuntimeError, match="after the writes"):
        dj.run_idempotent(idempotency, IdempotentRequest("client-1", "k2", "POST", "/items", b"{}"), boom)
    with pytest.raises(TransactionManagementError, match="its own atomic blocks"), transaction.atomic():
        dj.run_idempotent(idempotency, request, place)
    assert (first.replayed, again.replayed, again.body) == (False, True, first.body)
    assert len(calls) == 1
    assert counts(conn)[:2] == (1, 1)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 1


def test_djangos_migrations_and_estafetas_coexist_in_either_order(dj, runtime: Runtime, database_url: str) -> None:
    from django.core.management import call_command

    from examples.shelf import app

    # estafeta's tables are there already (the run's database was migrated first); Django's
    # migrate adds its own in public, touching no service schema, and finds nothing of estafeta's.
    call_command("migrate", verbosity=0, interactive=False)
    assert app.migrate(runtime, check=True) == {"shelf": []}
    with psycopg.connect(database_url) as check:
        django_tables = {row[0] for row in check.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        shelf_tables = {row[0] for row in check.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'shelf'")}
    assert {"django_migrations", "django_content_type"} <= django_tables
    assert "items" in shelf_tables and not any(t.startswith("django") for t in shelf_tables)
    # And estafeta migrate after Django's: still nothing to do, nothing of Django's touched.
    assert app.migrate(runtime) == {"shelf": []}
    call_command("migrate", verbosity=0, interactive=False, check_unapplied=True)


def test_the_view_places_an_item_once_and_rolls_back_a_failure_after_the_orm_write(dj, conn, monkeypatch) -> None:
    from django.test import RequestFactory, override_settings

    from examples.shelf_django import views

    factory = RequestFactory()

    def post(key: str | None, name: str) -> Any:
        headers = {} if key is None else {"Idempotency-Key": key}
        body = json.dumps({"name": name})
        return views.place_item(factory.post("/items", body, content_type="application/json", headers=headers))

    first = post('"k1"', "bolts")
    again = post('"k1"', "bolts")
    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (201, 201, "true")
    assert again.content == first.content
    assert post('"k1"', "nuts").status_code == 422  # the key again, another request
    assert post(None, "nuts").status_code == 400  # no key
    # A request that fails (the name is taken: a unique violation) keeps nothing and records no answer.
    with pytest.raises(django.db.IntegrityError):
        post('"k2"', "bolts")
    assert counts(conn)[:2] == (1, 1)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 1
    # A refusal after the ORM write and the send (the shelf is full) rolls both back, and is the key's answer.
    with override_settings(SHELF_CAPACITY=1):
        full, again = post('"k3"', "washers"), post('"k3"', "washers")
    assert (full.status_code, again.status_code, again["Idempotent-Replayed"]) == (409, 409, "true")
    assert counts(conn)[:2] == (1, 1)
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 2
