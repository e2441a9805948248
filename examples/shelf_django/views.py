"""A Django view placing an item: the ``Item`` row, the ``Restock`` command and the ``Idempotency-Key`` record.

All three commit in one ``atomic`` block, or none does.

Route it with ``path("items", views.place_item)``; a client retrying with the same key gets
the first answer, and the item is placed once.
"""

from __future__ import annotations

import json
import uuid

from django import http
from django.conf import settings
from django.views.decorators.http import require_POST

from estafeta import HttpResponse, IdempotentRequest, Problem, parse_idempotency_key
from estafeta import django as es
from examples.shelf import Restock, idempotency, shelf

from .models import Item

#: How many items the shelf holds (``SHELF_CAPACITY`` in the settings): a placement past it is
#: refused (409), after its write.
CAPACITY = 1000


class ShelfFull(Problem):
    """The shelf holds no more items."""

    status = 409
    title = "The shelf is full"


@require_POST  # type: ignore[untyped-decorator]
def place_item(request: http.HttpRequest) -> http.HttpResponse:
    try:
        key = parse_idempotency_key(request.headers.get("Idempotency-Key"))
        order = IdempotentRequest(
            client=request.META.get("REMOTE_ADDR", "anonymous"),
            key=key,
            method=request.method or "POST",
            target=request.get_full_path(),
            body=request.body,
            content_type=request.content_type,
        )

        def place() -> HttpResponse:
            item_id = uuid.uuid4()
            Item.objects.create(item_id=item_id, name=json.loads(order.body)["name"])
            es.send(shelf, Restock(item_id, 1))
            # Checked after the write, on what this transaction sees: a refusal rolls back
            # the item and the command, and is the key's answer from now on.
            capacity = getattr(settings, "SHELF_CAPACITY", CAPACITY)
            if Item.objects.count() > capacity:
                raise ShelfFull(f"the shelf holds {capacity} items")
            return HttpResponse.json(201, {"item_id": str(item_id)})

        answer = es.run_idempotent(idempotency, order, place)
    except Problem as problem:
        answer = problem.response()
    return _to_django(answer)


def _to_django(answer: HttpResponse) -> http.HttpResponse:
    response = http.HttpResponse(answer.body, status=answer.status)
    for name, value in answer.headers:
        response[name] = value
    if answer.replayed:
        response["Idempotent-Replayed"] = "true"
    return response
