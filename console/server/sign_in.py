"""The console's sign-in throttle and its signed notices.

Wrong operator passwords are slowed and then locked out per client (its remote address):
the first few are free, each one after that makes the client wait a growing delay (a
request inside it is answered 429 without looking at the password), and the tenth failed
attempt locks the client out for some minutes, the right password included. Failures are
counted in a Prometheus counter; only a lockout is logged, once.

A notice (what an action did, shown on the page it redirects to) travels in the redirect's
query string with an HMAC of its text under a key of this process, so a link made anywhere
else cannot put its own words on a console page.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import secrets
import threading
import time

import attrs
from prometheus_client import Counter

logger = logging.getLogger(__name__)

#: Failed sign-ins by outcome: ``wrong_password`` (checked and wrong), ``throttled`` (refused
#: unchecked inside the client's delay) and ``locked_out`` (refused while the client is locked out).
SIGN_IN_FAILURES = Counter(
    "estafeta_console_sign_in_failures", "Console requests refused for a wrong or throttled password", ["outcome"]
)
#: Clients locked out after too many failed sign-ins.
LOCKOUTS = Counter("estafeta_console_lockouts", "Console clients locked out after repeated wrong passwords")


class Refusal(enum.Enum):
    """Why a client's sign-in is not even checked."""

    THROTTLED = "throttled"
    LOCKED_OUT = "locked_out"


@attrs.frozen
class SignInPolicy:
    """How many failures a client gets, how it is slowed, and how long it is locked out."""

    #: Failures answered at once (a typo or two).
    free_failures: int = 3
    #: The delay after the first failure past the free ones; it doubles with each one after.
    first_delay: float = 1.0
    #: The longest delay between two attempts.
    max_delay: float = 60.0
    #: Failed attempts (wrong or throttled) that lock the client out.
    lockout_after: int = 10
    #: Seconds a locked-out client is refused, whatever it sends.
    lockout: float = 900.0
    #: Clients remembered at most (the oldest is forgotten first).
    max_clients: int = 10_000


@attrs.define
class _Client:
    failures: int = 0
    #: ``time.monotonic()`` before which the client is refused unchecked.
    wait_until: float = 0.0
    locked: bool = False


class SignIns:
    """Failed sign-ins per client: whether to check a client's password, and what a failure costs.

    Thread-safe (FastAPI runs the check in its thread pool). Times are this process's own
    monotonic clock: the throttle is per process and decides nothing stored anywhere.
    """

    def __init__(self, policy: SignInPolicy | None = None) -> None:
        self.policy = policy or SignInPolicy()
        self._clients: dict[str, _Client] = {}
        self._lock = threading.Lock()

    def refusal(self, client: str) -> tuple[Refusal, float] | None:
        """Why ``client`` may not try now and the seconds until it may, or ``None``; a refusal counts as a failure."""
        now = time.monotonic()
        with self._lock:
            state = self._clients.get(client)
            if state is None or now >= state.wait_until:
                if state is not None and state.locked:
                    del self._clients[client]  # the lockout is over: a fresh start
                return None
            wait = state.wait_until - now
            if state.locked:
                SIGN_IN_FAILURES.labels(Refusal.LOCKED_OUT.value).inc()
                return Refusal.LOCKED_OUT, wait
            SIGN_IN_FAILURES.labels(Refusal.THROTTLED.value).inc()
            self._count(client, state, now)
            return (Refusal.LOCKED_OUT if state.locked else Refusal.THROTTLED), state.wait_until - now

    def failed(self, client: str) -> float | None:
        """Count a wrong password from ``client``; the seconds of its lockout if this failure began one."""
        SIGN_IN_FAILURES.labels("wrong_password").inc()
        now = time.monotonic()
        with self._lock:
            state = self._clients.pop(client, None) or _Client()
            self._clients[client] = state  # last used, last forgotten
            while len(self._clients) > self.policy.max_clients:
                del self._clients[next(iter(self._clients))]
            self._count(client, state, now)
            return state.wait_until - now if state.locked else None

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures."""
        with self._lock:
            self._clients.pop(client, None)

    def _count(self, client: str, state: _Client, now: float) -> None:
        policy = self.policy
        state.failures += 1
        if state.failures >= policy.lockout_after:
            state.locked, state.wait_until = True, now + policy.lockout
            LOCKOUTS.inc()
            logger.warning(
                "console: sign-in from %s locked out for %g s after %d failed attempts",
                client,
                policy.lockout,
                state.failures,
            )
        elif state.failures > policy.free_failures:
            delay = policy.first_delay * 2 ** (state.failures - policy.free_failures - 1)
            state.wait_until = now + min(delay, policy.max_delay)


class Notices:
    """Notices signed by this process: only a notice this console wrote is shown."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def sign(self, text: str) -> str:
        """The signature of ``text``, for the redirect's query string."""
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def verified(self, text: str | None, signature: str | None) -> str | None:
        """``text`` if ``signature`` is its signature by this process, else ``None`` (the notice is dropped)."""
        if not text or not signature:
            return None
        return text if hmac.compare_digest(self.sign(text), signature) else None
