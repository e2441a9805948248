"""The order API over HTTP: ``POST /orders`` with an Idempotency-Key, ``GET /orders/{id}``, ``GET /sagas/{id}``.

``estafeta serve`` serves it (FastAPI on uvicorn, with ``/health`` and the operator
console); errors are ``application/problem+json`` documents. ``POST /orders`` places the
order, starts its saga and records the Idempotency-Key in one transaction of the orders
database (:class:`estafeta.Idempotency`): a client retrying after a timeout, a dropped
connection or a crashed server never places a second order.

Keys are scoped per client. The client is named by a request header that the gateway in
front of the API sets once it has authenticated the caller (``X-Client-Id`` unless
``--client-header`` says otherwise); a request without it belongs to the ``anonymous``
client. The gateway must drop that header from the outside request, or one client could
replay another's answers.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

import attrs
import psycopg
from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from estafeta import (
    PROBLEM_JSON,
    HttpResponse,
    Idempotency,
    IdempotentRequest,
    Problem,
    Runtime,
    Saga,
    parse_idempotency_key,
)

from . import orders
from .app import app as order_system
from .order_saga import ORDER_SAGA, place_order

#: The response header carrying the saga an order started (seed 002: the saga id travels in HTTP headers).
SAGA_ID_HEADER = "Saga-Id"
#: Identifiers of customers and SKUs: printable, no spaces, at most 64 characters.
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$"
_CLIENT = re.compile(r"[!-~]{1,200}")


@attrs.frozen
class ApiOptions:
    """How ``estafeta serve`` runs the order API."""

    #: How long an Idempotency-Key's record answers repeats.
    idempotency_ttl: timedelta = timedelta(hours=24)
    #: The header naming the (authenticated) client; keys are scoped per client.
    client_header: str = "X-Client-Id"
    #: ``False`` places orders sent without a key, with no record (the benchmark's baseline).
    require_idempotency_key: bool = True
    #: Seconds a 409 (the key's first request still running) tells the client to wait.
    retry_after: int = 1


class NotFound(Problem):
    """No such resource."""

    status = 404
    title = "Not Found"


class ClientInvalid(Problem):
    """The client header is not a client id."""

    status = 400
    type = "urn:estafeta:problem:client-invalid"
    title = "The client id is malformed"


class NewOrder(BaseModel):
    """An order to place: the customer pays ``amount_cents`` for ``quantity`` units of ``sku``."""

    model_config = ConfigDict(extra="forbid")

    customer_id: Annotated[str, Field(pattern=_ID_PATTERN, examples=["c1"])]
    sku: Annotated[str, Field(pattern=_ID_PATTERN, examples=["s1"])]
    quantity: Annotated[int, Field(ge=1, le=10_000)]
    amount_cents: Annotated[int, Field(ge=1, le=10_000_000_000)]


class PlacedOrderBody(BaseModel):
    """A placed order: its saga now charges, reserves and confirms it (or compensates)."""

    order_id: uuid.UUID
    saga_id: uuid.UUID
    status: Literal["pending"]


class LogEntryBody(BaseModel):
    """One transition of a saga."""

    version: int
    status: str
    step: str
    event: str
    detail: str | None
    at: datetime


class SagaBody(BaseModel):
    """A saga's state and its timeline, oldest transition first."""

    saga_id: uuid.UUID
    kind: str
    key: str
    status: Literal["running", "compensating", "gave_up", "completed", "compensated", "failed"]
    current_step: str
    version: int
    attempts: int
    deadline_at: datetime | None
    started_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    last_error: str | None
    timeline: list[LogEntryBody]


class OrderBody(BaseModel):
    """An order as stored, with its saga."""

    order_id: uuid.UUID
    customer_id: str
    sku: str
    quantity: int
    amount_cents: int
    status: Literal["pending", "confirmed", "cancelled"]
    created_at: datetime
    updated_at: datetime
    saga: SagaBody | None


#: What each problem status of the order API means, for its OpenAPI document.
_PROBLEMS = {
    400: "No Idempotency-Key, or a malformed one (or a malformed client id)",
    404: "No such order or saga",
    409: "The first request with this Idempotency-Key is still running: retry after Retry-After seconds",
    413: "The body is over the server's limit (64 KiB)",
    422: "The body or a parameter is invalid, or the Idempotency-Key was used for a different request",
    503: "The database is unavailable: retry after Retry-After seconds",
}


_PLACED_HEADERS = {
    "Location": {"description": "The order's URL", "schema": {"type": "string"}},
    SAGA_ID_HEADER: {"description": "The id of the order's saga", "schema": {"type": "string", "format": "uuid"}},
    "Idempotent-Replayed": {
        "description": "`true` when this is the stored answer to an earlier request with the same key",
        "schema": {"type": "string", "enum": ["true"]},
    },
}

#: Where a placed order leads (OpenAPI links: clients and fuzzers follow them).
_PLACED_LINKS = {
    "GetOrder": {"operationId": "getOrder", "parameters": {"order_id": "$response.body#/order_id"}},
    "GetSaga": {"operationId": "getSaga", "parameters": {"saga_id": "$response.body#/saga_id"}},
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for problem documents (their schema, ``ProblemBody``, is the server's)."""
    schema = {"$ref": "#/components/schemas/ProblemBody"}
    return {s: {"description": _PROBLEMS[s], "content": {PROBLEM_JSON: {"schema": schema}}} for s in statuses}


async def raw_body(request: Request) -> bytes:
    """The request body as sent (the fingerprint is of this, canonicalised, not of the parsed model)."""
    return await request.body()


class OrderApi:
    """The order API's routes, on ``runtime``'s orders database."""

    def __init__(self, runtime: Runtime, options: ApiOptions | None = None) -> None:
        self.runtime = runtime
        self.options = options or ApiOptions()
        #: The Idempotency-Key records of ``POST /orders`` (``estafeta serve`` prunes them).
        self.keys = Idempotency(orders.SERVICE, ttl=self.options.idempotency_ttl, retry_after=self.options.retry_after)
        #: The routes, for ``FastAPI.include_router``.
        self.router = APIRouter(tags=["orders"])
        self.router.add_api_route(
            "/orders",
            self.place,
            methods=["POST"],
            status_code=201,
            response_model=PlacedOrderBody,
            operation_id="placeOrder",
            responses={
                201: {"headers": _PLACED_HEADERS, "links": _PLACED_LINKS},
                **problem_responses(400, 409, 413, 422, 503),
            },
            response_description="The order is placed and its saga started (replayed: by the key's first request)",
            summary="Place an order and start its saga (Idempotency-Key required)",
        )
        self.router.add_api_route(
            "/orders/{order_id}", self.get_order, methods=["GET"], response_model=OrderBody, operation_id="getOrder",
            responses=problem_responses(404, 422, 503), summary="An order, its status and its saga's timeline",
        )  # fmt: skip
        self.router.add_api_route(
            "/sagas/{saga_id}", self.get_saga, methods=["GET"], response_model=SagaBody, operation_id="getSaga",
            responses=problem_responses(404, 422, 503), summary="A saga of any kind and its timeline",
        )  # fmt: skip

    def place(
        self,
        order: NewOrder,
        request: Request,
        body: Annotated[bytes, Depends(raw_body)],
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        traceparent: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Place ``order``: the order row, its saga row, its first command and the key's record in one transaction."""
        key = parse_idempotency_key(idempotency_key, required=self.options.require_idempotency_key)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        client = self._client(request)
        asked = IdempotentRequest(client, key, "POST", target, body, request.headers.get("content-type"))
        answer = self.keys.run(self.runtime, asked, lambda conn: self._place(conn, order, traceparent))
        return as_response(answer)

    def _client(self, request: Request) -> str:
        client = request.headers.get(self.options.client_header)
        if client is None:
            return "anonymous"
        if not _CLIENT.fullmatch(client):
            raise ClientInvalid(f"{self.options.client_header} must be 1 to 200 printable ASCII characters")
        return client

    def _place(self, conn: psycopg.Connection[Any], order: NewOrder, traceparent: str | None) -> HttpResponse:
        placed = place_order(
            conn,
            customer_id=order.customer_id,
            sku=order.sku,
            quantity=order.quantity,
            amount_cents=order.amount_cents,
            step_timeout=self.runtime.settings.saga_step_timeout,
            traceparent=traceparent,
        )
        document = {"order_id": str(placed.order_id), "saga_id": str(placed.saga_id), "status": "pending"}
        headers = {"Location": f"/orders/{placed.order_id}", SAGA_ID_HEADER: str(placed.saga_id)}
        return HttpResponse.json(201, document, headers)

    def get_order(self, order_id: uuid.UUID) -> OrderBody:
        """The order, its status and its saga's timeline."""
        with self.runtime.database(orders.SERVICE.name).connection() as conn:
            order = orders.get_order(conn, order_id)
            if order is None:
                raise NotFound(f"no order {order_id}")
            saga_ids = ORDER_SAGA.of_key(conn, order_id)
            saga = saga_body(conn, ORDER_SAGA, saga_ids[-1]) if saga_ids else None
        fields = {name: getattr(order, name) for name in OrderBody.model_fields if name != "saga"}
        return OrderBody(**fields, saga=saga)

    def get_saga(self, saga_id: uuid.UUID) -> SagaBody:
        """The saga ``saga_id``, whichever kind it is."""
        for saga in order_system.sagas:
            with self.runtime.database(saga.service).connection() as conn:
                found = saga_body(conn, saga, saga_id)
            if found is not None:
                return found
        raise NotFound(f"no saga {saga_id}")


def saga_body(conn: psycopg.Connection[Any], saga: Saga, saga_id: uuid.UUID) -> SagaBody | None:
    """The saga ``saga_id`` of kind ``saga`` with its timeline, if it exists."""
    row = saga.get(conn, saga_id)
    if row is None:
        return None
    timeline = [LogEntryBody(**attrs.asdict(entry)) for entry in saga.timeline(conn, saga_id)]
    fields = {name: getattr(row, name) for name in SagaBody.model_fields if name not in ("kind", "key", "timeline")}
    return SagaBody(**fields, kind=saga.name, key=str(row.key), timeline=timeline)


def as_response(answer: HttpResponse) -> Response:
    """``answer`` as a Starlette response; a replay says so (``Idempotent-Replayed: true``)."""
    headers = dict(answer.headers)
    media_type = headers.pop("content-type", None)
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(answer.body, status_code=answer.status, headers=headers, media_type=media_type)
