"""``kafka://`` URLs: the servers, how queues map to topics and consumer groups, client settings.

``kafka://[user:password@]host:9092[,host2:9092][?name=value&...]``. estafeta's own
parameters (no dot in their name):

- ``topic_prefix`` (default empty): queue ``Q`` lives in topic ``<prefix>Q``, its delay
  topic is ``<prefix>Q.DQ`` and its dead letters go to ``<prefix>Q.XQ`` (Dramatiq's
  queue names, so ``dramatiq`` tooling reads them as it reads the other brokers' queues);
- ``partitions`` (default 6), ``replication_factor`` (default -1, the cluster's
  ``default.replication.factor``) and ``min_insync_replicas`` (default: the cluster's
  ``min.insync.replicas``): of the topics estafeta creates when they are missing
  (existing topics are used as they are);
- ``group`` (default ``estafeta``): the consumer group of queue ``Q`` is ``<group>.<topic>``,
  one group per queue, so workers serving different sets of queues never share a group;
- ``rebalance_grace_ms`` (default 5000): how long a worker losing a partition in a
  rebalance waits for its in-flight messages before abandoning them.

Any parameter with a dot is a librdkafka property: ``producer.<name>`` for producers only,
``consumer.<name>`` for consumers only, anything else (``ssl.ca.location``,
``security.protocol``...) for every client. A user name and password in the URL become
``sasl.username`` and ``sasl.password`` (``sasl.mechanism`` PLAIN and ``security.protocol``
SASL_SSL unless the URL says otherwise). The settings the guarantees rest on are not
negotiable and are always set: idempotent producers with ``acks=all``; consumers that
never commit on their own and start a new group at the earliest offset.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

#: Characters Kafka allows in a topic name.
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
#: Topic names longer than this are refused by Kafka.
MAX_TOPIC_LENGTH = 249
DEFAULT_PORT = 9092

#: What every estafeta producer is, whatever the URL says: the relay's guarantees rest on it.
PRODUCER_REQUIRED = {"enable.idempotence": "true", "acks": "all"}
#: What every estafeta consumer is: offsets are committed by estafeta alone, only up to the
#: lowest message in flight, and a new group starts from the oldest record (a message the
#: relay published before the first worker started must not be skipped).
CONSUMER_REQUIRED = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "auto.offset.reset": "earliest",
}
#: Defaults a URL may override. A short session lets a killed worker's partitions move on
#: quickly (and Tansu answers a join only after half the session timeout). librdkafka
#: pre-fetches up to 64 MB per consumer by default, and a worker has two consumers per
#: queue: a few thousand records are plenty for Dramatiq's prefetch.
CONSUMER_DEFAULTS = {"session.timeout.ms": "10000", "queued.min.messages": "1000", "queued.max.messages.kbytes": "8192"}
PRODUCER_DEFAULTS = {"linger.ms": "5"}
#: Defaults of every client a URL may override. A request (a fetch, a produce, a join, a
#: metadata request) with no answer within ``socket.timeout.ms`` fails and its connection is
#: closed and opened again: librdkafka's 60 s would leave a consumer on a silent cut waiting
#: twice as long as a producer's delivery timeout (30 s), the bound the docs state.
COMMON_DEFAULTS = {"socket.timeout.ms": "30000"}


@attrs.frozen
class KafkaConfig:
    """A parsed ``kafka://`` URL."""

    #: ``host:port`` of the bootstrap servers.
    servers: tuple[str, ...]
    topic_prefix: str = ""
    partitions: int = 6
    replication_factor: int = -1
    #: ``min.insync.replicas`` of the topics estafeta creates (``None``: the cluster's default).
    min_insync_replicas: int | None = None
    group: str = "estafeta"
    #: Seconds a revoked partition's in-flight messages may take to finish before they are abandoned.
    rebalance_grace: float = 5.0
    #: librdkafka properties for every client, producers only, consumers only.
    common: Mapping[str, str] = attrs.field(factory=dict)
    producer: Mapping[str, str] = attrs.field(factory=dict)
    consumer: Mapping[str, str] = attrs.field(factory=dict)

    def topic(self, queue_name: str) -> str:
        """The topic of ``queue_name`` (``.DQ`` and ``.XQ`` names included)."""
        return self.topic_prefix + queue_name

    def group_id(self, queue_name: str) -> str:
        """The consumer group of ``queue_name``'s consumers: one group per topic."""
        return f"{self.group}.{self.topic(queue_name)}"

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers``, also what error messages name."""
        return ",".join(self.servers)

    def admin_config(self) -> dict[str, Any]:
        """Configuration of an admin client."""
        return {**COMMON_DEFAULTS, **self.common, "bootstrap.servers": self.bootstrap}

    def producer_config(self, client_id: str, **overrides: Any) -> dict[str, Any]:
        """Configuration of an idempotent, ``acks=all`` producer named ``client_id``."""
        return {
            **COMMON_DEFAULTS,
            **PRODUCER_DEFAULTS,
            "client.id": client_id,
            **self.common,
            **self.producer,
            **overrides,
            **PRODUCER_REQUIRED,
            "bootstrap.servers": self.bootstrap,
        }

    def consumer_config(self, queue_name: str, client_id: str) -> dict[str, Any]:
        """Configuration of a consumer of ``queue_name``'s group that commits nothing by itself."""
        config: dict[str, Any] = {
            **COMMON_DEFAULTS,
            **CONSUMER_DEFAULTS,
            "client.id": client_id,
            **self.common,
            **self.consumer,
        }
        if "heartbeat.interval.ms" not in config:
            config["heartbeat.interval.ms"] = str(max(100, int(config["session.timeout.ms"]) // 3))
        return {
            **config,
            **CONSUMER_REQUIRED,
            "group.id": self.group_id(queue_name),
            "bootstrap.servers": self.bootstrap,
        }


def parse_kafka_url(url: str) -> KafkaConfig:
    """The configuration a ``kafka://`` URL describes; ``ValueError`` with the reason if it is not one."""
    parts = urlsplit(url)
    if parts.scheme != "kafka":
        raise ValueError(f"not a kafka:// URL: scheme {parts.scheme!r}")
    if parts.path not in ("", "/"):
        raise ValueError(f"a kafka:// URL has no path (got {parts.path!r}); name topics with ?topic_prefix=")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    servers = tuple(_server(host) for host in hosts.split(","))
    options, common, producer, consumer = _parameters(parts.query)
    if userinfo:
        user, _, password = userinfo.partition(":")
        common = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": unquote(user),
            "sasl.password": unquote(password),
            **common,
        }
    replicas, in_sync = options.get("replication_factor", -1), options.get("min_insync_replicas")
    if in_sync is not None and replicas > 0 and in_sync > replicas:
        why = "Kafka could acknowledge no write"
        raise ValueError(f"min_insync_replicas {in_sync} is more than replication_factor {replicas}: {why}")
    return KafkaConfig(servers=servers, common=common, producer=producer, consumer=consumer, **options)


def _parameters(query: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str], dict[str, str]]:
    """estafeta's options, and the librdkafka properties for every client, producers, consumers."""
    options: dict[str, Any] = {}
    common: dict[str, str] = {}
    producer: dict[str, str] = {}
    consumer: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if name.startswith("producer."):
            producer[name.removeprefix("producer.")] = value
        elif name.startswith("consumer."):
            consumer[name.removeprefix("consumer.")] = value
        elif "." in name:
            common[name] = value
        else:
            field = _option_name(name)
            options[field] = _option(name, value)
    return options, common, producer, consumer


def _server(host: str) -> str:
    host = host.strip()
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not colon:
        name, port = host, str(DEFAULT_PORT)
    if not name:
        raise ValueError(f"no host in {host!r}" if host else "no host in the kafka:// URL")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} of {name} is not a port number")
    return f"{name}:{port}"


_OPTIONS = {
    "topic_prefix": "topic_prefix",
    "partitions": "partitions",
    "replication_factor": "replication_factor",
    "min_insync_replicas": "min_insync_replicas",
    "group": "group",
    "rebalance_grace_ms": "rebalance_grace",
}


def _option_name(name: str) -> str:
    if name not in _OPTIONS:
        known = ", ".join(_OPTIONS)
        raise ValueError(
            f"unknown kafka:// parameter {name!r} (estafeta's are {known}; librdkafka properties have a dot)"
        )
    return _OPTIONS[name]


def _option(name: str, value: str) -> Any:
    if name == "topic_prefix":
        if value and not TOPIC_NAME.match(value):
            raise ValueError(f"topic_prefix {value!r} has characters Kafka refuses in a topic name (A-Z a-z 0-9 . _ -)")
        return value
    if name == "group":
        if not value:
            raise ValueError("group is empty")
        return value
    minimum = {"partitions": 1, "replication_factor": -1, "min_insync_replicas": 1, "rebalance_grace_ms": 0}[name]
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a whole number") from None
    if number < minimum or (number == 0 and name == "replication_factor"):
        raise ValueError(f"{name} {number} is out of range")
    return number / 1000 if name == "rebalance_grace_ms" else number


def check_topic_name(topic: str) -> str | None:
    """Why Kafka would refuse ``topic`` as a topic name, or ``None``."""
    if not TOPIC_NAME.match(topic):
        return f"topic name {topic!r} has characters Kafka refuses (A-Z a-z 0-9 . _ -)"
    if len(topic) > MAX_TOPIC_LENGTH:
        return f"topic name {topic[:40]!r}... is longer than {MAX_TOPIC_LENGTH} characters"
    return None


class ClientLog:
    """librdkafka's log lines through Python ``logging``, each kind at most once per ``interval``.

    A broker that is down makes librdkafka log every reconnect attempt (several a second);
    estafeta reports the outage itself (the relay's pause, Dramatiq's consumer restarts),
    so a reminder per kind of line is enough.
    """

    def __init__(self, logger: logging.Logger, interval: float = 30.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[tuple[int, str], float] = {}
        self._lock = threading.Lock()

    def log(self, level: int, message: str, *args: object) -> None:
        """What librdkafka calls: ``message % args`` is ``facility [client] text``."""
        facility = str(args[0]) if args else message
        now = time.monotonic()
        with self._lock:
            last = self._last.get((level, facility))
            if last is not None and now - last < self.interval:
                return
            self._last[(level, facility)] = now
        self.logger.log(level, message, *args)


class ClientErrors:
    """librdkafka's error events (``error_cb``): logged like :class:`ClientLog`, a fatal one kept.

    With an ``error_cb``, confluent-kafka hands a fatal error (a producer whose sequence the
    broker lost, say) to it instead of raising it out of ``poll``/``flush``; the producer's
    owner then sees :attr:`fatal`, drops the producer and makes a new one.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.log = ClientLog(logger)
        #: The fatal ``KafkaError``, once one happened.
        self.fatal: Any = None
        #: When librdkafka last said that every broker was down (``time.monotonic()``).
        self.all_down_at: float | None = None

    def __call__(self, error: Any) -> None:
        if error.fatal():
            self.fatal = error
            self.logger.error("Kafka client failed: %s", error.str())
        else:
            if error.name() == "_ALL_BROKERS_DOWN":
                self.all_down_at = time.monotonic()
            self.log.log(logging.WARNING, "%s [%s] %s", error.name(), "error", error.str())
