"""Idempotency-Key for HTTP APIs (draft-ietf-httpapi-idempotency-key-header), in the request's own transaction.

A client sends ``Idempotency-Key: "<uuid>"`` with a request that has an effect (placing an
order); when it times out, it sends the same request with the same key again and gets
the first answer instead of a second effect. Libraries that keep the key's record in a
cache beside the database write it after the handler: a crash between the two repeats
the effect. Here the record is one more row in the transaction of the business change
(its saga row and outbox rows included), so they commit together or not at all.

What a request with a key gets (the draft's rules):

- no key where one is required, or a malformed one: 400;
- a key whose first request is still running: 409 with ``Retry-After``, at once;
- a key used before with a different request (method, target or canonical body): 422;
- a key used before with the same request: the stored status, headers and body,
  marked ``replayed`` (``Idempotent-Replayed: true``);
- otherwise the handler runs; a 2xx or 3xx commits with the record; a 4xx (a refusal)
  rolls back the handler's writes and is then recorded in a transaction of its own, so
  the refusal is replayed too (unless another request with the key got in between: its
  answer is the record then); a 5xx or an exception stores nothing, so the retry runs
  again.

Keys are scoped per client, and a record expires (24 hours by default); expired records
are pruned in batches (:meth:`Idempotency.prune`).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from estafeta.idempotency.problem import HttpResponse, Problem
from estafeta.sagas.model import as_timedelta
from estafeta_sql import idempotency as store
from estafeta_sql import plan
from estafeta_sql.errors import DatabaseError, DatabaseUnavailable

if TYPE_CHECKING:
    from estafeta.app.runtime import Runtime
    from estafeta.app.service import Service

T = TypeVar("T")

#: How long a key's record is kept when nothing else is said.
DEFAULT_TTL = timedelta(hours=24)
#: The longest key accepted (a UUID needs 36 characters).
MAX_KEY_LENGTH = 255
# Claims per request: a lost race (a record committed between a claim's snapshot and its
# lock) costs one more; the next claim sees that record.
_ATTEMPTS = 3
_PROBLEMS = "urn:estafeta:problem:"
# RFC 8941 sf-string: printable ASCII, with \" and \\ the only escapes.
_QUOTED = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"(;.*)?')
# The bare form: printable ASCII without spaces, quotes or backslashes (so "a, b", two
# keys folded into one header, is refused).
_BARE = re.compile(r"[!#-\[\]-~]+")
_JSON_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json\b", re.IGNORECASE)


class IdempotencyKeyMissing(Problem):
    """This operation requires an Idempotency-Key header."""

    status = 400
    type = _PROBLEMS + "idempotency-key-missing"
    title = "Idempotency-Key is missing"


class IdempotencyKeyInvalid(Problem):
    """The Idempotency-Key header is not a key."""

    status = 400
    type = _PROBLEMS + "idempotency-key-invalid"
    title = "Idempotency-Key is malformed"


class IdempotencyKeyReused(Problem):
    """The Idempotency-Key was already used for a different request."""

    status = 422
    type = _PROBLEMS + "idempotency-key-reused"
    title = "Idempotency-Key is already used"


class IdempotencyKeyInFlight(Problem):
    """The first request with this Idempotency-Key is still being processed."""

    status = 409
    type = _PROBLEMS + "idempotency-key-in-flight"
    title = "A request is outstanding for this Idempotency-Key"


def parse_idempotency_key(value: str | None, *, required: bool = True) -> str | None:
    """The key in an ``Idempotency-Key`` header: the draft's quoted string (``"abc"``) or bare (``abc``).

    Both forms name the same key. Raises :class:`IdempotencyKeyMissing` (no header, or an
    empty one, when ``required``; ``None`` otherwise) or :class:`IdempotencyKeyInvalid`.
    """
    text = (value or "").strip()
    if not text:
        if required:
            raise IdempotencyKeyMissing("send an Idempotency-Key header (a fresh UUID for each new request)")
        return None
    quoted = _QUOTED.fullmatch(text)
    if quoted:
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif _BARE.fullmatch(text):
        key = text
    else:
        raise IdempotencyKeyInvalid(
            'the Idempotency-Key must be a quoted string ("...") or a run of printable ASCII without spaces'
        )
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise IdempotencyKeyInvalid(f"the Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters long")
    return key


def canonical_body(body: bytes, content_type: str | None) -> bytes:
    """``body`` as the fingerprint sees it: JSON re-serialised (keys sorted, no spaces), anything else as is."""
    if content_type and _JSON_TYPE.match(content_type):
        try:
            document = json.loads(body)
        except ValueError:
            return body
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return body


@attrs.frozen
class IdempotentRequest:
    """What the idempotency record needs of a request."""

    #: Who sent it: keys are scoped per client.
    client: str
    #: The parsed ``Idempotency-Key`` (:func:`parse_idempotency_key`); ``None``: none was sent.
    key: str | None
    method: str
    #: The path and query the request was sent to.
    target: str
    body: bytes = b""
    content_type: str | None = None

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the method, target and canonical body: equal for the same request, sent again."""
        digest = hashlib.sha256(f"{self.method.upper()}\n{self.target}\n".encode())
        digest.update(canonical_body(self.body, self.content_type))
        return digest.hexdigest()


#: A handler: given the transaction's connection, do the work and answer.
Handler = Callable[[psycopg.Connection[Any]], HttpResponse]


class Idempotency:
    """Idempotency-Key records in ``service``'s schema, written in the transaction of the work they guard.

    Declaring it adds the ``idempotency_keys`` table to the service's migrations. ``ttl``
    (seconds or a timedelta) is how long a record answers repeats; ``retry_after`` the
    seconds a 409 tells the client to wait.
    """

    def __init__(self, service: Service, *, ttl: timedelta | float = DEFAULT_TTL, retry_after: int = 1) -> None:
        service.use_builtin_migrations(store.MIGRATIONS)
        #: The schema (and database) of the records: the service whose transactions they join.
        self.service = service.name
        kept = as_timedelta(ttl)
        if kept is None or kept <= timedelta(0):
            raise ValueError("an idempotency record's ttl must be positive")
        #: How long a record answers repeats of its key.
        self.ttl = kept
        self.retry_after = retry_after

    def run(self, runtime: Runtime, request: IdempotentRequest, handler: Handler) -> HttpResponse:
        """Answer ``request``: replay its key's record, or run ``handler`` in one transaction with the new record.

        Raises the 409 and 422 problems of the module's rules; ``handler``'s exceptions
        propagate with nothing stored. Without a key, ``handler`` runs in a transaction
        of its own that an answer of 400 or more rolls back.
        """
        with runtime.database(self.service).connection() as conn:
            return self.run_on(conn, request, handler)

    def run_on(self, conn: psycopg.Connection[Any], request: IdempotentRequest, handler: Handler) -> HttpResponse:
        """:meth:`run` on a connection of the service's database (in autocommit: the transactions are this method's)."""

        def perform(step: Step) -> Any:
            return handler(conn) if step is Step.HANDLE else boundary(conn, step)

        return plan.run(conn, self.plan_for(request), perform)

    def plan_for(self, request: IdempotentRequest) -> plan.Plan[HttpResponse]:
        """:meth:`run` for ``request`` as a plan, for any driver: its transactions and its call of the handler.

        Besides statements it yields :class:`Step` values: the driver begins, commits or
        rolls back a transaction of its own, or calls the handler in the open transaction
        (answering with the handler's :class:`HttpResponse`). ``estafeta.aio`` and
        ``estafeta.sqlalchemy`` drive it on async connections and ORM sessions.
        """
        if request.key is None:
            return (yield from _transaction(_without_key()))
        for _ in range(_ATTEMPTS):
            try:
                response = yield from _transaction(self._attempt(request, request.key))
            except _LostRace:
                continue  # the winner's record is visible now: the next attempt answers with it
            except (Problem, DatabaseUnavailable):
                raise  # the claim's answers (in flight, reused key), or no database to look in
            except Exception as failed:
                # The claim may have missed a record committed after its snapshot (see
                # claim_key), and the handler then failed on that request's writes (a unique
                # key it took first): that record is the answer. Otherwise, the failure is.
                if not (yield from self._answered_meanwhile(request, request.key, failed)):
                    raise
                continue
            if 400 <= response.status < 500 and not response.replayed:
                # The refusal's own transaction, right after the one that rolled the handler's
                # writes back (so a success pays for no savepoint).
                yield from _transaction(self._record_refusal(request, request.key, response))
            return response
        raise RuntimeError(f"key {request.key!r} of {request.client!r}: its record keeps changing under its lock")

    def _attempt(self, request: IdempotentRequest, key: str) -> plan.Plan[tuple[bool, HttpResponse]]:
        # One transaction: the key's claim, the handler's work and the record. An answer of
        # 400 or more keeps none of the handler's writes (a refusal is recorded afterwards).
        replay = yield from self._claim(request, key)
        if replay is not None:
            return True, replay
        response = yield from _handle()
        if response.status >= 400:
            return False, response
        if not (yield from self._store(request, key, response)):
            raise _LostRace()
        return True, response

    def _claim(self, request: IdempotentRequest, key: str) -> plan.Plan[HttpResponse | None]:
        found, locked = yield from self._claim_key(request, key)
        if not locked:
            raise IdempotencyKeyInFlight(
                f"the first request with this key is still being processed: retry in {self.retry_after} s",
                headers={"Retry-After": str(self.retry_after)},
            )
        if found is None:
            return None
        if found.fingerprint != request.fingerprint:
            raise IdempotencyKeyReused(
                "this key was used for a different request (method, path or body); send a new key for a new request"
            )
        return HttpResponse(found.status, found.headers, found.body, replayed=True)

    def _claim_key(self, request: IdempotentRequest, key: str) -> plan.Plan[tuple[store.StoredKey | None, bool]]:
        """The key's unexpired record, or whether this transaction took the key's lock (``claim_key``)."""
        return (
            yield from store.claim_plan(
                self.service, client=request.client, key=key, lock_name=self._lock_name(request.client, key)
            )
        )

    def _answered_meanwhile(self, request: IdempotentRequest, key: str, failed: Exception) -> plan.Plan[bool]:
        """Whether the key has a record now, after an attempt that saw none failed with ``failed``."""
        try:
            return (yield from _transaction(self._recorded(request, key)))
        except Exception as also:
            raise failed from also  # the database is gone too: the attempt's own failure is the one to tell

    def _recorded(self, request: IdempotentRequest, key: str) -> plan.Plan[tuple[bool, bool]]:
        found, _ = yield from self._claim_key(request, key)
        return False, found is not None  # rolled back: a lock it took goes with it

    def _record_refusal(
        self, request: IdempotentRequest, key: str, response: HttpResponse
    ) -> plan.Plan[tuple[bool, None]]:
        # If another request with the key came in between, its answer is the key's record and
        # this refusal is not kept.
        found, locked = yield from self._claim_key(request, key)
        if found is None and locked:
            yield from self._store(request, key, response)
        return True, None

    def _store(self, request: IdempotentRequest, key: str, response: HttpResponse) -> plan.Plan[bool]:
        return (
            yield from store.store_plan(
                self.service,
                client=request.client,
                key=key,
                fingerprint=request.fingerprint,
                method=request.method.upper(),
                target=request.target,
                status=response.status,
                headers=response.headers,
                body=response.body,
                ttl=self.ttl,
            )
        )

    def _lock_name(self, client: str, key: str) -> str:
        return "\x1f".join(("estafeta.idempotency", self.service, client, key))

    def prune(self, runtime: Runtime, *, batch_size: int = 1000) -> int:
        """Delete expired records, ``batch_size`` per transaction (short locks, short WAL bursts); return how many."""
        total = 0
        with runtime.database(self.service).connection() as conn:
            while True:
                deleted = store.prune(conn, self.service, batch_size)
                total += deleted
                if deleted < batch_size:
                    return total


class _LostRace(Exception):
    """Another request with the key committed its record after this one's claim looked: start over."""


class Step(enum.Enum):
    """What :meth:`Idempotency.plan` asks of its driver, besides statements."""

    #: Begin a transaction.
    BEGIN = "begin"
    #: Commit it.
    COMMIT = "commit"
    #: Roll it back.
    ROLLBACK = "rollback"
    #: Call the handler in the open transaction; answer with its :class:`HttpResponse`.
    HANDLE = "handle"


def _transaction(body: plan.Plan[tuple[bool, T]]) -> plan.Plan[T]:
    """``body`` in a transaction of its own: committed if it says so, rolled back if not or if it raises."""
    yield Step.BEGIN
    try:
        commit, value = yield from body
        yield Step.COMMIT if commit else Step.ROLLBACK
    except Exception:
        yield Step.ROLLBACK
        raise
    return value


def _handle() -> plan.Plan[HttpResponse]:
    try:
        response: HttpResponse = yield Step.HANDLE
    except Problem as problem:
        return problem.response()
    return response


def _without_key() -> plan.Plan[tuple[bool, HttpResponse]]:
    # Nothing to record: an answer of 400 or more leaves nothing behind.
    response = yield from _handle()
    return response.status < 400, response


def boundary(conn: psycopg.Connection[Any], step: Step) -> None:
    """Begin, commit or roll back a transaction on the autocommit ``conn``."""
    if step is Step.BEGIN:
        conn.execute("BEGIN")
    elif step is Step.COMMIT:
        _committed(conn.execute("COMMIT").statusmessage)
    elif conn.info.transaction_status != TransactionStatus.IDLE and not conn.closed:
        conn.execute("ROLLBACK")


async def boundary_async(conn: psycopg.AsyncConnection[Any], step: Step) -> None:
    """:func:`boundary` on an asynchronous connection."""
    if step is Step.BEGIN:
        await conn.execute("BEGIN")
    elif step is Step.COMMIT:
        _committed((await conn.execute("COMMIT")).statusmessage)
    elif conn.info.transaction_status != TransactionStatus.IDLE and not conn.closed:
        await conn.execute("ROLLBACK")


def _committed(status: str | None) -> None:
    if status != "COMMIT":
        # PostgreSQL answers a COMMIT of a failed transaction with ROLLBACK.
        raise DatabaseError(f"the idempotency record's transaction did not commit ({status})")
