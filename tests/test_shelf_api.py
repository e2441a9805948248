"""The FastAPI example (``examples/shelf/api.py``) under uvicorn, on async SQLAlchemy: many requests, one loop."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from estafeta import Runtime
from examples.shelf.api import make_api

from .helpers import scalar, wait_until
from .services import free_port
from .test_sqlalchemy import counts, engine_url


@pytest.fixture
def shelf_api(database_url: str, runtime: Runtime) -> Iterator[str]:
    """The shelf API served by uvicorn in a thread (capacity 25 items); yields its base URL."""
    port = free_port()
    url = engine_url(database_url).render_as_string(hide_password=False)
    server = uvicorn.Server(
        uvicorn.Config(make_api(url, capacity=25), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


def place(client: httpx.AsyncClient, name: str, key: str | None) -> Any:
    headers = {} if key is None else {"Idempotency-Key": f'"{key}"'}
    return client.post("/items", json={"name": name}, headers=headers)


def test_many_concurrent_placements_each_commit_once_with_their_command(
    shelf_api: str, conn, stub_broker, stub_worker, running_relay
) -> None:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=shelf_api, timeout=60) as client:
            keys = [str(uuid.uuid4()) for _ in range(20)]
            # Every request twice, at once: the key's lock lets one through, the other gets
            # a 409 (in flight) or the replay.
            sent = [place(client, f"item {n}", key) for n, key in enumerate(keys) for _ in range(2)]
            first = await asyncio.gather(*sent)
            retried = await asyncio.gather(*(place(client, f"item {n}", key) for n, key in enumerate(keys)))
            return [*first, *retried]

    answers = asyncio.run(main())
    assert {a.status_code for a in answers} <= {201, 409}
    assert all(a.status_code == 201 and a.headers["Idempotent-Replayed"] == "true" for a in answers[40:])
    assert scalar(conn, "SELECT count(*) FROM shelf.items") == 20
    assert scalar(conn, "SELECT count(*) FROM shelf.idempotency_keys") == 20
    # Each item's Restock reaches its step through the relay: every item ends with quantity 1.
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM shelf.items WHERE quantity = 1") == 20, what="restocks")


def test_a_refusal_after_the_orm_write_rolls_back_the_item_and_its_command(shelf_api: str, conn) -> None:
    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=shelf_api, timeout=60) as client:
            for n in range(25):
                assert (await place(client, f"item {n}", str(uuid.uuid4()))).status_code == 201
            full = await place(client, "one too many", "k-full")
            again = await place(client, "one too many", "k-full")
            missing = await place(client, "no key", None)
            return full, again, missing

    full, again, missing = asyncio.run(main())
    assert (full.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (409, 409, "true")
    assert missing.status_code == 400
    assert counts(conn)[:2] == (25, 25)  # the 26th item and its Restock rolled back
