"""``POST /items``: a FastAPI service on async SQLAlchemy placing items through the outbox, with ``Idempotency-Key``.

The ``Item`` row, the ``Restock`` command and the key's record commit in one
``AsyncSession`` transaction, or none of them does; the handler never blocks the event
loop (every database call is awaited on psycopg's ``AsyncConnection``). Serve it with
``uvicorn`` (``make_api(url)`` takes a ``postgresql+psycopg://`` URL). Needs the ``http``
and ``sqlalchemy`` extras.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, Response
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from estafeta import HttpResponse, IdempotentRequest, Problem, parse_idempotency_key
from estafeta.sqlalchemy import asyncio as aes

from . import Item, Restock, idempotency, shelf

#: How many items the shelf holds: a placement past it is refused (409), after its write.
CAPACITY = 1000


class ShelfFull(Problem):
    """The shelf holds no more items."""

    status = 409
    title = "The shelf is full"


def make_api(url: str, *, capacity: int = CAPACITY) -> FastAPI:
    """The FastAPI app on the database at ``url`` (``postgresql+psycopg://...``)."""
    engine = create_async_engine(url, pool_size=20)
    sessions = async_sessionmaker(engine)

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    api = FastAPI(title="shelf", lifespan=lifespan)

    @api.post("/items")
    async def place_item(request: Request) -> Response:
        body = await request.body()
        try:
            order = IdempotentRequest(
                client=request.client.host if request.client else "anonymous",
                key=parse_idempotency_key(request.headers.get("Idempotency-Key")),
                method=request.method,
                target=request.url.path,
                body=body,
                content_type=request.headers.get("content-type"),
            )

            async def place(session: AsyncSession) -> HttpResponse:
                item_id = uuid.uuid4()
                session.add(Item(item_id=item_id, name=json.loads(body)["name"], quantity=0))
                await aes.send(session, shelf, Restock(item_id, 1))
                # Checked after the write, on what this transaction sees: a refusal rolls back
                # the item and the command, and is the key's answer from now on.
                if (await session.scalar(select(func.count()).select_from(Item)) or 0) > capacity:
                    raise ShelfFull(f"the shelf holds {capacity} items")
                return HttpResponse.json(201, {"item_id": str(item_id)})

            async with sessions() as session:
                answer = await aes.run_idempotent(session, idempotency, order, place)
        except Problem as problem:
            answer = problem.response()
        headers = dict(answer.headers)
        if answer.replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response(answer.body, answer.status, headers=headers)

    return api
