"""estafeta's configuration: ``ESTAFETA_*`` environment variables over an optional TOML file."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs

from estafeta.app.errors import SettingsError
from estafeta_brokers import check_url, redact_url
from estafeta_sql.pool import check_dsn

#: A TOML file with the same settings (keys are the variable names without the
#: ``ESTAFETA_`` prefix, lower-cased); the environment wins over it.
CONFIG_FILE_VARIABLE = "ESTAFETA_CONFIG"
#: The app the ``estafeta`` command works on (``--app``): a module defining an ``estafeta.App``
#: (read by the CLI, not a runtime setting).
APP_VARIABLE = "ESTAFETA_APP"

_SERVICE_DSN = re.compile(r"^ESTAFETA_([A-Z][A-Z0-9_]*)_DATABASE_URL$")

#: Integer settings: variable suffix -> (attribute, minimum).
_INTEGERS: dict[str, tuple[str, float]] = {
    "RELAY_BATCH_SIZE": ("relay_batch_size", 1),
    "RELAY_MAX_ATTEMPTS": ("relay_max_attempts", 1),
    "RELAY_WAIT_STANDBYS": ("relay_wait_standbys", 0),
    "MAX_RETRIES": ("max_retries", 0),
    "MIN_BACKOFF_MS": ("min_backoff_ms", 1),
    "MAX_BACKOFF_MS": ("max_backoff_ms", 1),
    "MAX_DELIVERIES": ("max_deliveries", 1),
    "MAX_WORKER_DEATHS": ("max_worker_deaths", 1),
    "LOCK_TIMEOUT_MS": ("lock_timeout_ms", 1),
    "LOCK_TTL_MS": ("lock_ttl_ms", 1),
    "POOL_SIZE": ("pool_size", 1),
    "METRICS_PORT": ("metrics_port", 1),
    "PRUNE_BATCH_SIZE": ("prune_batch_size", 1),
    "HANDOFFS": ("handoffs", 0),
}
_FLOATS: dict[str, tuple[str, float]] = {
    "RELAY_POLL_INTERVAL": ("relay_poll_interval", 0.01),
    "SAGA_STEP_TIMEOUT": ("saga_step_timeout", 0.01),
    "SAGA_WATCH_INTERVAL": ("saga_watch_interval", 0.01),
    "SAGA_STUCK_AFTER": ("saga_stuck_after", 0.01),
    "HEARTBEAT_INTERVAL": ("heartbeat_interval", 0.1),
}
#: Settings with a fixed set of values: variable suffix -> (attribute, allowed values).
_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "LOG_FORMAT": ("log_format", ("text", "json")),
    "RABBITMQ_QUEUE_TYPE": ("rabbitmq_queue_type", ("classic", "quorum")),
    "WAKEUP": ("wakeup", ("notify", "after-commit", "poll")),
}
#: Durations (``7d``, ``12h``, ``30m``, ``45s``; a bare number is seconds): variable suffix -> attribute.
_DURATIONS: dict[str, str] = {
    "INBOX_RETENTION": "inbox_retention",
    "DEAD_LETTER_RETENTION": "dead_letter_retention",
    "FENCE_RETENTION": "fence_retention",
    "SAGA_LOG_RETENTION": "saga_log_retention",
    "PRUNE_INTERVAL": "prune_interval",
}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@attrs.frozen
class Settings:
    """Everything estafeta reads from its environment, validated."""

    #: A PostgreSQL DSN for every service, or ``embedded``: a private PostgreSQL (pgserver) in
    #: ``.estafeta/pgdata``.
    database_url: str = "embedded"
    #: A separate database for one service (``ESTAFETA_PAYMENTS_DATABASE_URL``), overriding
    #: ``database_url`` for it.
    service_database_urls: Mapping[str, str] = attrs.field(factory=dict)
    #: ``stub://``, ``amqp://user:pass@host:5672/vhost`` (a cluster's nodes:
    #: ``amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost``, tried in order, failed over),
    #: ``redis://host:6379/0[?namespace=prefix][&wait=N]`` (``wait``: replicas that must
    #: acknowledge a batch) or ``kafka://host:9092[,host2:9092][?...]``.
    broker_url: str = "stub://"
    #: ``postgres`` (transaction-scoped locks) or one or more comma-separated ``redis://`` URLs
    #: (several make a Redlock quorum).
    lock_url: str = "postgres"
    #: ``classic`` (Dramatiq's own queues) or ``quorum``: replicated quorum queues, declared by
    #: the workers and the relay alike, with an ``x-delivery-limit`` of ``max_deliveries``
    #: (see docs/how-to/quorum-queues.md). RabbitMQ broker URLs only.
    rabbitmq_queue_type: str = "classic"
    #: Rows the relay claims and publishes per round trip.
    relay_batch_size: int = 500
    #: Seconds between relay polls when no NOTIFY wakes it.
    relay_poll_interval: float = 1.0
    #: How a commit that wrote outbox rows or events wakes the relays and projectors:
    #: ``after-commit`` (a step's transaction sends no ``NOTIFY``; once it committed, a thread
    #: of the worker process sends the wake-ups of every step committed since its last round
    #: from a connection of its own; writes outside steps still NOTIFY at commit), ``notify``
    #: (a ``NOTIFY`` inside every writing transaction, delivered at its commit: PostgreSQL
    #: commits notifying transactions one at a time) or ``poll`` (no ``NOTIFY`` from this
    #: process's pools: relays and projectors find rows at their poll interval, so lower
    #: ``ESTAFETA_RELAY_POLL_INTERVAL``). The default comes from docs/performance.md, "Wake-ups".
    wakeup: str = "after-commit"
    #: Hand-offs after one delivery (docs/concepts/steps.md, "Hand-offs"): when a step's
    #: transaction wrote one message, due now, for a step this process declares on the same
    #: database, of a queue its worker consumes, the worker thread runs that step at once,
    #: skipping the relay and the broker;
    #: the outbox row, leased from the relays for 5 s, is deleted by the next step's
    #: transaction (a relay publishes it if the hand-off fails, at once, or if the worker dies
    #: first, when the lease ends). Up to this many in a row; 0 (the default): never.
    handoffs: int = 0
    #: Publish attempts before an outbox row becomes ``failed``.
    relay_max_attempts: int = 5
    #: Standbys (``pg_stat_replication``) that must have flushed an outbox row's commit before
    #: the relay publishes it; 0 publishes at once. For asynchronous replication: a failover
    #: then loses a step and its messages together, never a step whose message already left.
    #: The relay's user needs ``pg_monitor`` to see the standbys' positions.
    relay_wait_standbys: int = 0
    #: Dramatiq retries of a failing step (transient errors; business failures are not retried).
    max_retries: int = 10
    #: Milliseconds before the first retry of a failing step (the backoff doubles per retry).
    min_backoff_ms: int = 500
    #: The longest backoff between two retries of a step, in milliseconds.
    max_backoff_ms: int = 300_000
    #: Deliveries of one message (Dramatiq's retries of a step that raises, and redeliveries)
    #: before it is parked.
    max_deliveries: int = 25
    #: Deliveries of one message that died with their process (the worker SIGKILLed, killed
    #: out of memory, crashed while the step ran) before the message is parked, with the
    #: reason "killed its worker N times", instead of killing another worker. A delivery
    #: is counted as started before its work; one that neither committed nor ended with an
    #: error died with its process. On RabbitMQ a first delivery is not counted (nothing can
    #: have died of it yet): the redelivery after a kill records that death.
    max_worker_deaths: int = 3
    #: How long a step waits for its lock before giving up (and retrying later).
    lock_timeout_ms: int = 5_000
    #: Lease of a Redis lock; a holder past it is fenced off.
    lock_ttl_ms: int = 30_000
    #: Connections per service database in each process: Dramatiq's 8 worker threads, the
    #: saga watchdog and one to spare (code outside steps), so a busy worker never waits
    #: for a connection.
    pool_size: int = 10
    #: Seconds a saga waits for a step's reply before its watchdog re-sends the command
    #: (x2, x3 for later attempts; steps may declare their own); kept in each saga's row when it starts.
    saga_step_timeout: float = 30.0
    #: Seconds between the saga watchdog's looks for sagas past their deadline.
    saga_watch_interval: float = 1.0
    #: Seconds a live saga may stay in one state (re-sends are not progress) before the
    #: metrics count it as stuck (``estafeta_sagas_stuck``).
    saga_stuck_after: float = 300.0
    #: Seconds between the heartbeats of each long-running process (workers, relays, projectors,
    #: ``estafeta serve``); a process that missed three reads as stale (``estafeta status``).
    heartbeat_interval: float = 5.0
    #: ``text`` or ``json`` (one object per line): how ``dramatiq`` worker processes (and the CLI,
    #: ``--log-format``) write log lines.
    log_format: str = "text"
    #: The port where each ``dramatiq`` command serves the Prometheus metrics of all its
    #: worker processes (``None``: no metrics server).
    metrics_port: int | None = None
    #: The address that metrics server listens on.
    metrics_host: str = "0.0.0.0"
    #: How long the inbox (and the delivery counts) remember a processed message: a copy
    #: arriving later runs again. Never shorter than ``dead_letter_retention``. Durations:
    #: ``7d``, ``12h``, ``30m``, ``45s`` (a bare number is seconds).
    inbox_retention: timedelta = timedelta(days=7)
    #: How long dead letters are kept for an operator (a dead letter's inbox record is kept as long).
    dead_letter_retention: timedelta = timedelta(days=7)
    #: How long the fence row of a lock key nobody took since is kept (keep it above ``lock_ttl_ms``).
    fence_retention: timedelta = timedelta(days=1)
    #: How long the transition log of a completed or compensated saga is kept (failed sagas
    #: keep theirs; saga rows stay).
    saga_log_retention: timedelta = timedelta(days=30)
    #: How often each worker process prunes (``0``: never; ``estafeta prune`` still does).
    prune_interval: timedelta = timedelta(hours=1)
    #: Rows deleted per statement when pruning (each its own short transaction).
    prune_batch_size: int = 1000
    #: The operator's password for ``estafeta serve``'s console (HTTP Basic auth; required
    #: with ``--allow-actions``): ``ESTAFETA_CONSOLE_PASSWORD``, or the first line of the file
    #: ``ESTAFETA_CONSOLE_PASSWORD_FILE`` names. Never shown in a repr or a log line.
    console_password: str | None = attrs.field(default=None, repr=False)
    #: The name of this deployment, stamped by its relays on every message they publish: a
    #: worker parks a message stamped by another deployment instead of running it
    #: (docs/how-to/run-for-real.md, "One broker namespace per deployment"). Unset, it is
    #: derived from the databases: the default database's name and a hash of each
    #: database's PostgreSQL ``system_identifier`` and name. Set it when the derived name
    #: would not tell deployments apart (databases restored from one physical backup) or
    #: would change under a deployment (a ``pg_upgrade`` gives a new ``system_identifier``).
    deployment: str | None = None

    def database_url_for(self, service: str) -> str:
        """The DSN of ``service``'s database."""
        return self.service_database_urls.get(service, self.database_url)

    def variable_of(self, service: str) -> str:
        """The variable that sets ``service``'s database: its own, or ``ESTAFETA_DATABASE_URL``."""
        if service in self.service_database_urls:
            return f"ESTAFETA_{service.upper()}_DATABASE_URL"
        return "ESTAFETA_DATABASE_URL"

    @property
    def broker_options(self) -> dict[str, Any]:
        """What ``broker_from_url`` needs beside the URL: the RabbitMQ queue type and delivery limit."""
        if self.rabbitmq_queue_type == "quorum":
            return {"queue_type": "quorum", "delivery_limit": self.max_deliveries}
        return {}

    @property
    def redacted_broker_url(self) -> str:
        """The broker URL without its password."""
        return redact_url(self.broker_url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the settings; raise :class:`SettingsError` naming the bad variable."""
        env = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        overrides: dict[str, str] = {}
        for name, value in {**_from_file(env), **env}.items():
            if not name.startswith("ESTAFETA_") or name in (CONFIG_FILE_VARIABLE, APP_VARIABLE):
                continue
            suffix = name.removeprefix("ESTAFETA_")
            match = _SERVICE_DSN.match(name)
            if suffix == "DATABASE_URL":
                values["database_url"] = _database_url(name, value)
            elif match:
                overrides[match.group(1).lower()] = _database_url(name, value)
            elif suffix == "BROKER_URL":
                values["broker_url"] = _broker_url(name, value)
            elif suffix == "LOCK_URL":
                values["lock_url"] = _lock_url(name, value)
            elif suffix == "DEPLOYMENT":
                values["deployment"] = _deployment(name, value)
            elif suffix == "METRICS_HOST":
                values["metrics_host"] = value.strip() or "0.0.0.0"
            elif suffix in ("CONSOLE_PASSWORD", "CONSOLE_PASSWORD_FILE"):
                values["console_password"] = _console_password(name, value, values.get("console_password"))
            elif suffix in _CHOICES:
                attribute, allowed = _CHOICES[suffix]
                values[attribute] = _choice(name, value, allowed)
            elif suffix in _INTEGERS:
                attribute, minimum = _INTEGERS[suffix]
                values[attribute] = _number(name, value, int, minimum)
            elif suffix in _FLOATS:
                attribute, minimum = _FLOATS[suffix]
                values[attribute] = _number(name, value, float, minimum)
            elif suffix in _DURATIONS:
                values[_DURATIONS[suffix]] = _duration(name, value)
            else:
                raise SettingsError(name, "unknown setting (see docs/reference/settings.md)")
        settings = cls(**values, service_database_urls=overrides)
        if settings.max_backoff_ms < settings.min_backoff_ms:
            raise SettingsError("ESTAFETA_MAX_BACKOFF_MS", "must not be below ESTAFETA_MIN_BACKOFF_MS")
        if settings.rabbitmq_queue_type != "classic" and not settings.broker_url.startswith(("amqp://", "amqps://")):
            raise SettingsError(
                "ESTAFETA_RABBITMQ_QUEUE_TYPE",
                f"{settings.rabbitmq_queue_type} queues need a RabbitMQ broker (amqp://),"
                f" not {settings.redacted_broker_url}",
            )
        if settings.metrics_port is not None and settings.metrics_port > 65535:
            raise SettingsError("ESTAFETA_METRICS_PORT", f"{settings.metrics_port} is not a TCP port (1-65535)")
        if settings.inbox_retention < settings.dead_letter_retention:
            raise SettingsError(
                "ESTAFETA_INBOX_RETENTION",
                f"{_human(settings.inbox_retention)} is shorter than ESTAFETA_DEAD_LETTER_RETENTION"
                f" ({_human(settings.dead_letter_retention)}): a dead letter's inbox record must outlive it,"
                " or a late copy of the message could run beside its replay",
            )
        return settings


def _from_file(env: Mapping[str, str]) -> dict[str, str]:
    path = Path(env.get(CONFIG_FILE_VARIABLE) or "estafeta.toml")
    if CONFIG_FILE_VARIABLE not in env and not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(CONFIG_FILE_VARIABLE, f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(CONFIG_FILE_VARIABLE, f"{path} is not valid TOML: {exc}") from None
    return {f"ESTAFETA_{key.upper()}": str(value) for key, value in data.items()}


def _database_url(name: str, value: str) -> str:
    value = value.strip()
    if value == "embedded":
        return value
    if not value:
        raise SettingsError(name, "is empty (a PostgreSQL DSN, or 'embedded')")
    try:
        check_dsn(value)
    except ValueError as exc:
        raise SettingsError(name, f"not a PostgreSQL DSN: {exc}") from None
    return value


#: The shortest operator password the console accepts (a passphrase of a few words is longer).
CONSOLE_PASSWORD_MIN_LENGTH = 12


def _console_password(name: str, value: str, already: str | None) -> str:
    if already is not None:
        raise SettingsError(name, "set only one of ESTAFETA_CONSOLE_PASSWORD and ESTAFETA_CONSOLE_PASSWORD_FILE")
    if name.endswith("_FILE"):
        try:
            value = Path(value.strip()).read_text(encoding="utf-8").partition("\n")[0]
        except OSError as exc:
            raise SettingsError(name, f"cannot read the password file {value.strip()}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SettingsError(name, f"the password file {value.strip()} is not UTF-8 text") from None
    if not value.strip():
        raise SettingsError(name, "is empty: give the console's password, or unset the variable")
    if len(value.strip()) < CONSOLE_PASSWORD_MIN_LENGTH:
        # Never the value, nor its length: a log of this line says nothing about the password.
        raise SettingsError(
            name, f"is too short: the console's password needs at least {CONSOLE_PASSWORD_MIN_LENGTH} characters"
        )
    return value.strip()


def _broker_url(name: str, value: str) -> str:
    try:
        check_url(value.strip())
    except ValueError as exc:
        raise SettingsError(name, str(exc)) from None
    return value.strip()


def _lock_url(name: str, value: str) -> str:
    value = value.strip()
    if value == "postgres":
        return value
    for url in value.split(","):
        if not url.strip().startswith(("redis://", "rediss://")):
            raise SettingsError(name, f"{redact_url(url.strip())!r} is neither 'postgres' nor a redis:// URL")
    return value


_DEPLOYMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/~-]{0,99}$")


def _deployment(name: str, value: str) -> str:
    value = value.strip()
    if not _DEPLOYMENT.match(value):
        raise SettingsError(name, f"{value!r} is not a deployment name (up to 100 letters, digits and . _ : @ / ~ -)")
    return value


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise SettingsError(name, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _number(name: str, value: str, kind: type[int] | type[float], minimum: float) -> Any:
    try:
        number: float = kind(value)
    except ValueError:
        raise SettingsError(name, f"{value!r} is not a number") from None
    if number < minimum:
        raise SettingsError(name, f"{value} is below the minimum {minimum}")
    return number


def _duration(name: str, value: str) -> timedelta:
    match = _DURATION.match(value.strip().lower())
    if not match:
        raise SettingsError(name, f"{value!r} is not a duration (a number and s, m, h or d: 7d, 12h, 30m, 45s)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def _human(duration: timedelta) -> str:
    seconds = duration.total_seconds()
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} seconds"
