"""The ASGI app ``estafeta serve`` runs: an app's HTTP API, ``/health`` and the operator console.

Every error leaves as an ``application/problem+json`` document (RFC 9457), whichever
layer raised it: an :class:`estafeta.Problem`, a validation error, an unknown route, a
database that is down (503 with ``Retry-After``), or a bug (500, its traceback logged,
never sent). Under ``/console`` the same errors are HTML pages with a link to try again
(:mod:`estafeta_console.pages.errors`): a person reads them, not a client.

The server's pools check each connection before lending it
(:meth:`estafeta.Runtime.check_connections_before_use`): after a database restart, the
connections it dropped are replaced before a request uses them, not reported as a 503.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import estafeta
from estafeta import PROBLEM_JSON, App, DatabaseUnavailable, Problem, Runtime, StatementFailed

from ..pages.errors import ErrorPages, is_console_path
from ..pages.routes import Console

logger = logging.getLogger(__name__)

#: Seconds a 503 (database unavailable) tells the client to wait.
UNAVAILABLE_RETRY_AFTER = 5
#: The largest request body read (an order is a few hundred bytes); more is a 413.
MAX_BODY_BYTES = 64 * 1024
#: The Idempotency-Key values the parser accepts: bare, or an RFC 8941 string (its escapes count once).
KEY_PATTERN = r'^(?:[!#-\[\]-~]{1,255}|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")$'
#: Where the OpenAPI document defines a problem document (``ProblemBody``, added by ``_openapi``).
PROBLEM_REF = {"$ref": "#/components/schemas/ProblemBody"}
_PROBLEM_SCHEMA = {
    "title": "ProblemBody",
    "description": "An RFC 9457 problem document.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "A URI naming the kind of problem"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What was wrong with this request"},
        "instance": {"type": "string", "description": "The path of the request"},
    },
}


@attrs.frozen
class WebOptions:
    """What ``estafeta serve`` was asked for beyond the app's own API."""

    #: The console's actions (retry, resume, abort) are served only when this is set.
    allow_actions: bool = False
    #: Seconds between passes deleting expired Idempotency-Key records (in batches).
    prune_interval: float = 300.0
    #: The operator's password the console asks for (HTTP Basic auth); required with ``allow_actions``.
    console_password: str | None = attrs.field(default=None, repr=False)
    #: The port of the console's own listener: requests there reach only the console (and
    #: ``/health``), requests elsewhere never reach it. ``None``: one listener serves all.
    console_port: int | None = None


def create_app(
    app: App,
    runtime: Runtime,
    options: WebOptions,
    *,
    routers: Sequence[APIRouter] = (),
    pruners: Sequence[Callable[[], int]] = (),
) -> FastAPI:
    """The ASGI app serving ``routers`` (the app's API), ``/health`` and the console of ``app``."""
    web = FastAPI(
        title=f"{app.name} API",
        version=estafeta.__version__,
        description="Served by `estafeta serve`. Errors are application/problem+json documents (RFC 9457).",
        lifespan=_lifespan(runtime, pruners, options.prune_interval),
    )
    # A request must not be the one that finds a connection dead after a restart.
    runtime.check_connections_before_use()
    install_problem_handlers(web)
    web.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    web.include_router(health_router(app, runtime))
    for router in routers:
        web.include_router(router)
    console = Console(app, runtime, allow_actions=options.allow_actions, password=options.console_password)
    web.include_router(console.router, include_in_schema=False)
    web.state.console_errors = console.errors
    if options.console_port is not None:
        web.add_middleware(ConsoleListener, port=options.console_port)
    web.openapi = lambda: _openapi(web)  # type: ignore[method-assign]
    return web


def _lifespan(runtime: Runtime, pruners: Sequence[Callable[[], int]], interval: float) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = threading.Thread(target=_prune_until, args=(stop, pruners, interval), name="prune", daemon=True)
        if pruners:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(timeout=10)
            runtime.close()

    return lifespan


def _prune_until(stop: threading.Event, pruners: Sequence[Callable[[], int]], interval: float) -> None:
    # Every replica prunes; their batches skip each other's rows (SKIP LOCKED).
    while not stop.wait(interval):
        for prune in pruners:
            try:
                deleted = prune()
            except estafeta.EstafetaError as exc:
                logger.warning("pruning expired idempotency records failed, retrying in %g s: %s", interval, exc)
                continue
            if deleted:
                logger.info("pruned %d expired idempotency record(s)", deleted)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is refused (413) before anyone buffers it."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared length over the limit at once; count the bytes of any other body as they come."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            await problem_response(self._too_large(), scope.get("path"))(scope, receive, send)
            return
        received, refused = 0, False

        async def counted() -> Message:
            # Past the limit: answer 413 here, then tell the app the client left; what it
            # answers to that is dropped (the response has been sent).
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                refused = True
                await problem_response(self._too_large(), scope.get("path"))(scope, receive, send)
                return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, unless_refused)

    def _too_large(self) -> Problem:
        return Problem(f"the request body is over {self.limit} bytes", status=413, title="Content Too Large")


class ConsoleListener:
    """ASGI middleware: the console answers only on its own port, and that port serves nothing else but /health."""

    def __init__(self, app: ASGIApp, *, port: int) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request for the other listener's routes is answered 404, as a route that is not there."""
        if scope["type"] == "http" and scope["path"] != "/health":
            on_console_port = (scope.get("server") or ("", None))[1] == self.port
            for_console = scope["path"] == "/console" or scope["path"].startswith("/console/")
            if on_console_port != for_console:
                problem = Problem(f"no route {scope['path']} on this port", status=404, title="Not Found")
                await problem_response(problem, scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


def health_router(app: App, runtime: Runtime) -> APIRouter:
    """``GET /health``: 200 when every database of ``app`` answers, 503 otherwise."""
    router = APIRouter(tags=["health"])

    unavailable = {"description": "A database does not answer", "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}}}

    @router.get(
        "/health",
        operation_id="health",
        summary="Whether every database of the app answers",
        responses={503: unavailable},
    )
    def health() -> dict[str, str]:
        """``{"status": "ok"}`` once each service's database answered ``SELECT 1``."""
        for service in app.service_names:
            with runtime.database(service).connection() as conn:
                conn.execute("SELECT 1")
        return {"status": "ok"}

    return router


def problem_response(problem: Problem, instance: str | None = None) -> Response:
    """``problem`` as an ``application/problem+json`` response."""
    document = problem.document()
    if instance:
        document["instance"] = instance
    body = json.dumps(document, separators=(",", ":")).encode()
    return Response(body, status_code=problem.status, headers=problem.headers, media_type=PROBLEM_JSON)


def install_problem_handlers(web: FastAPI) -> None:
    """Turn every error of ``web`` into a problem document."""
    web.add_exception_handler(Problem, _on_problem)
    web.add_exception_handler(HTTPException, _on_http_error)
    web.add_exception_handler(RequestValidationError, _on_invalid)
    web.add_exception_handler(DatabaseUnavailable, _on_unavailable)
    web.add_exception_handler(StatementFailed, _on_refused)
    web.add_exception_handler(Exception, _on_bug)


def _answer(request: Request, problem: Problem) -> Response:
    """``problem`` as a problem document; as an HTML page for the console's pages (a person reads those)."""
    pages: ErrorPages | None = getattr(request.app.state, "console_errors", None)
    if pages is not None and is_console_path(request.url.path):
        return pages.page(request, problem.status, problem.title, problem.detail, problem.headers)
    return problem_response(problem, request.url.path)


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return _answer(request, exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    title = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, "HTTP error")
    problem = Problem(detail, status=exc.status_code, title=title, headers=dict(exc.headers or {}))
    return _answer(request, problem)


async def _on_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _answer(request, _validation_problem(exc.errors()))


async def _on_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("%s %s: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER)}
    problem = Problem(
        "the database is unavailable: retry later", status=503, title="Service Unavailable", headers=headers
    )
    return _answer(request, problem)


async def _on_refused(request: Request, exc: Exception) -> Response:
    """A conflict or a timeout is worth a retry (503); any other refusal is the server's failure."""
    assert isinstance(exc, StatementFailed)
    if not exc.transient:
        return await _on_bug(request, exc)
    logger.warning("%s %s: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER)}
    problem = Problem(
        "the database could not finish the request (a conflict or a timeout): retry later",
        status=503,
        title="Service Unavailable",
        headers=headers,
    )
    return _answer(request, problem)


async def _on_bug(request: Request, exc: Exception) -> Response:
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _answer(request, Problem("the server failed; nothing was stored"))


def _validation_problem(errors: Sequence[Any]) -> Problem:
    where = []
    for error in errors[:5]:
        location = ".".join(str(part) for part in error.get("loc", ()))
        where.append(f"{location}: {error.get('msg', 'invalid')}")
    detail = "; ".join(where) or "the request is invalid"
    return Problem(detail, status=422, title="Unprocessable Content", type="urn:estafeta:problem:invalid-request")


def _openapi(web: FastAPI) -> dict[str, Any]:
    """FastAPI's document, saying what the server really does: problem documents, a required key."""
    if web.openapi_schema:
        return web.openapi_schema
    document = get_openapi(title=web.title, version=web.version, description=web.description, routes=web.routes)
    for path in document.get("paths", {}).values():
        for operation in path.values():
            _fix_operation(operation)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ProblemBody"] = _PROBLEM_SCHEMA
    web.openapi_schema = document
    return document


def _fix_operation(operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    if "422" in responses:
        description = responses["422"].get("description", "Validation Error")
        if description == "Validation Error":
            description = "The body or a parameter is invalid"
        responses["422"] = {"description": description, "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}}}
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "header" and parameter.get("name") == "Idempotency-Key":
            parameter["required"] = True
            parameter["description"] = (
                'A fresh key (a UUID) for each new request, the same key for its retries; quoted ("...") or bare.'
            )
            parameter["schema"] = {"type": "string", "pattern": KEY_PATTERN}
