"""Redis leases, redsync-style, with fencing tokens: one Redis server, or a Redlock quorum.

``with redis_lock("order:42", ttl=10) as lock:`` holds a lease on ``order:42`` for at most
``ttl`` seconds, on a majority of the Redis servers of ``ESTAFETA_LOCK_URL`` (or the URL
given). ``lock.token`` grows with every acquisition of the key: store it with the writes
made under the lock, and have the store refuse older tokens (:mod:`estafeta_sql.fences` does it in
PostgreSQL). A lease alone is not safe: a holder paused past its TTL keeps writing.

On each server a lease is ``SET key value NX PX ttl`` with a random value, taken in the
same script as ``INCR`` of the key's token counter; release and extension are
compare-and-delete and compare-and-extend scripts, so a holder whose lease expired can
neither release nor extend its successor's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from estafeta_brokers import redact_url, split_namespace
from estafeta_sql.errors import EstafetaError, LockNotAcquired

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)


def _redis() -> ModuleType:
    """redis-py, imported on first use: importing it (with its asyncio and observability
    modules) is half of every estafeta process's start, and most processes hold no Redis lock."""
    import redis

    return redis


#: Servers are independent (not replicas), so clocks drift apart: Redlock's allowance.
CLOCK_DRIFT_FACTOR = 0.01
#: How long one server may take to answer before it counts as failed for this round.
SOCKET_TIMEOUT = 0.5
#: Pause between acquisition rounds, drawn at random so that waiters do not march in step.
RETRY_DELAY = (0.005, 0.03)

_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return redis.call('INCR', KEYS[2])
elseif holder == ARGV[1] then
    -- A retried call whose first run succeeded: the counter is still ours.
    return tonumber(redis.call('GET', KEYS[2]))
end
return 0
"""
# Bring a server's counter up to the token chosen from the quorum, while our lease there
# is still alive: a later holder's INCR on that server then returns a larger number.
_RAISE_COUNTER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
"""
_ADVANCE_COUNTER = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class LockServerUnavailable(LockNotAcquired):
    """Too many lock servers could not be reached to form a quorum."""


class LockLost(EstafetaError):
    """The lease expired or was taken by another holder."""


class _Node:
    """One independent Redis server and its key prefix."""

    def __init__(self, url: str, socket_timeout: float) -> None:
        plain, namespace = split_namespace(url)
        self.description = redact_url(plain)
        self.prefix = f"{namespace}:estafeta" if namespace else "estafeta"
        lib = _redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client: redis.Redis = lib.Redis.from_url(
            plain,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            # One immediate reconnect (a server restarted under a pooled connection), no
            # backoff: waiting is the lock's business, bounded by its own deadline.
            retry=Retry(NoBackoff(), 1, supported_errors=(lib.ConnectionError,)),
        )
        self.acquire = self.client.register_script(_ACQUIRE)
        self.raise_counter = self.client.register_script(_RAISE_COUNTER)
        self.advance_counter = self.client.register_script(_ADVANCE_COUNTER)
        self.release = self.client.register_script(_RELEASE)
        self.extend = self.client.register_script(_EXTEND)

    def keys(self, key: str) -> tuple[str, str]:
        """The lease key and the token counter key of lock ``key``."""
        return f"{self.prefix}:lock:{key}", f"{self.prefix}:token:{key}"


@attrs.define(eq=False)
class RedisLock:
    """A lease on ``key``, held on a quorum of servers until ``valid_until``."""

    #: The lock's name (an order id...).
    key: str
    #: The random value only this holder knows: release and extend compare it.
    value: str
    #: The fencing token of this acquisition; larger than every earlier one of ``key``.
    token: int
    #: ``time.monotonic()`` after which the lease may have expired somewhere.
    valid_until: float
    _client: Redlock = attrs.field(repr=False)

    @property
    def remaining(self) -> float:
        """Seconds of lease left (not below zero); the holder must be done before then."""
        return max(0.0, self.valid_until - time.monotonic())

    def release(self) -> bool:
        """Give the lease up on every server; ``False`` if it was no longer held on a quorum."""
        return self._client.release(self)

    def extend(self, ttl: float) -> None:
        """Make the lease last ``ttl`` seconds from now; raise :class:`LockLost` if it was lost."""
        self._client.extend(self, ttl)


class Redlock:
    """A lock client over one or more independent Redis servers (a majority must agree).

    Thread-safe; keep one per process, it holds a connection pool per server.
    """

    def __init__(self, urls: Sequence[str], *, socket_timeout: float = SOCKET_TIMEOUT) -> None:
        if not urls:
            raise ValueError("a Redis lock needs at least one redis:// URL")
        self.nodes = [_Node(url.strip(), socket_timeout) for url in urls]
        self.quorum = len(self.nodes) // 2 + 1

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Redlock:
        """``redis://a[,redis://b,...]``: several URLs make a Redlock quorum."""
        return cls([part for part in url.split(",") if part.strip()], **options)

    @property
    def description(self) -> str:
        """The servers, passwords redacted."""
        return ", ".join(node.description for node in self.nodes)

    def acquire(self, key: str, ttl: float, wait: float) -> RedisLock:
        """Take the lease on ``key`` for ``ttl`` seconds, retrying for up to ``wait`` seconds.

        Raises :class:`LockNotAcquired` when another holder kept it that long, and
        :class:`LockServerUnavailable` at once when too few servers answer for a quorum.
        """
        deadline = time.monotonic() + wait
        while True:
            lock = self.try_acquire(key, ttl)
            if lock is not None:
                return lock
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockNotAcquired(
                    f"lock {key!r} not acquired within {wait:g} s on {self.description}: held by another"
                )
            time.sleep(min(left, random.uniform(*RETRY_DELAY)))

    def try_acquire(self, key: str, ttl: float) -> RedisLock | None:
        """One acquisition round on every server; ``None`` if another holder has the lease."""
        ttl_ms = max(1, int(ttl * 1000))
        value = secrets.token_urlsafe(18)
        started = time.monotonic()
        counters: dict[int, int] = {}
        failures: list[str] = []
        for index, node in enumerate(self.nodes):
            try:
                counter = int(node.acquire(keys=node.keys(key), args=[value, ttl_ms]))
            except _redis().RedisError as exc:
                failures.append(f"{node.description}: {exc}")
                continue
            if counter:
                counters[index] = counter
        token = max(counters.values(), default=0)
        if len(counters) >= self.quorum:
            counters = self._raise_counters(key, value, token, counters)
        valid_until = _lease_end(started, ttl_ms)
        if len(counters) >= self.quorum and valid_until > time.monotonic():
            return RedisLock(key, value, token, valid_until, self)
        self._release_everywhere(key, value)
        if len(failures) > len(self.nodes) - self.quorum:
            raise LockServerUnavailable(
                f"lock {key!r}: {len(failures)} of {len(self.nodes)} Redis lock servers unreachable "
                f"(a quorum needs {self.quorum}): {'; '.join(failures)}"
            )
        return None

    def _raise_counters(self, key: str, value: str, token: int, counters: dict[int, int]) -> dict[int, int]:
        """Bring every counter of the quorum up to ``token``; keep the servers where that worked."""
        kept = {}
        for index, counter in counters.items():
            node = self.nodes[index]
            try:
                if counter == token or node.raise_counter(keys=node.keys(key), args=[value, token]):
                    kept[index] = token
            except _redis().RedisError as exc:
                logger.warning("lock %r: could not raise the token counter on %s: %s", key, node.description, exc)
        return kept

    def release(self, lock: RedisLock) -> bool:
        """Delete ``lock``'s lease wherever it still carries its value; ``True`` on a quorum."""
        return self._release_everywhere(lock.key, lock.value) >= self.quorum

    def _release_everywhere(self, key: str, value: str) -> int:
        # Every server, not only those that said yes: a yes may have been lost on the way back.
        released = 0
        for node in self.nodes:
            try:
                released += int(node.release(keys=node.keys(key)[:1], args=[value]))
            except _redis().RedisError as exc:
                # Debug only: with a server down this happens on every failed round, and the
                # lease there expires by itself.
                logger.debug("lock %r: could not release on %s (expires by itself): %s", key, node.description, exc)
        return released

    def extend(self, lock: RedisLock, ttl: float) -> None:
        """Extend ``lock`` to ``ttl`` seconds from now on a quorum, or raise :class:`LockLost`."""
        ttl_ms = max(1, int(ttl * 1000))
        started = time.monotonic()
        extended = 0
        for node in self.nodes:
            with contextlib.suppress(_redis().RedisError):
                extended += int(node.extend(keys=node.keys(lock.key)[:1], args=[lock.value, ttl_ms]))
        valid_until = _lease_end(started, ttl_ms)
        if extended < self.quorum or valid_until <= time.monotonic():
            raise LockLost(f"lock {lock.key!r} (token {lock.token}) was lost before it could be extended")
        lock.valid_until = valid_until

    def advance_tokens(self, key: str, at_least: int) -> None:
        """Make the next token of ``key`` larger than ``at_least`` on every reachable server.

        Used when the fence table has seen a larger token than the servers hand out (a
        server restarted empty): the next acquisition then gets a token the fence accepts.
        """
        for node in self.nodes:
            with contextlib.suppress(_redis().RedisError):
                node.advance_counter(keys=node.keys(key)[1:], args=[at_least])

    def close(self) -> None:
        """Close every server's connections."""
        for node in self.nodes:
            node.client.close()


def _lease_end(started: float, ttl_ms: int) -> float:
    """When a lease set after ``started`` may have expired somewhere (Redlock's validity).

    Every server set its key after ``started``, so each lives until at least ``started +
    ttl`` by its own clock; the allowance covers clocks drifting apart (they are separate
    machines) and the 1 ms resolution of PX.
    """
    return started + (ttl_ms - ttl_ms * CLOCK_DRIFT_FACTOR - 2) / 1000


_CLIENTS: dict[str, Redlock] = {}
_CLIENTS_LOCK = threading.Lock()


def _default_url() -> str:
    url = os.environ.get("ESTAFETA_LOCK_URL", "").strip()
    return url if url.startswith(("redis://", "rediss://")) else "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def redis_lock(key: str, ttl: float = 30.0, *, wait: float = 10.0, url: str | None = None) -> Iterator[RedisLock]:
    """Hold the lease on ``key`` for the block (at most ``ttl`` seconds), then release it.

    ``url`` defaults to ``ESTAFETA_LOCK_URL`` when it names Redis, else the local Redis;
    comma-separated URLs make a Redlock quorum. Waits up to ``wait`` seconds for another
    holder (:class:`LockNotAcquired` after). The block must not outlive the lease: pass
    ``lock.token`` to the store so that a holder that did is refused (:mod:`estafeta_sql.fences`).
    """
    url = url or _default_url()
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(url)
        if client is None:
            client = _CLIENTS[url] = Redlock.from_url(url)
    lock = client.acquire(key, ttl, wait)
    try:
        yield lock
    finally:
        lock.release()
