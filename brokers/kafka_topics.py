"""Making sure a queue's topics exist: ``<queue>``, ``<queue>.DQ`` and ``<queue>.XQ``.

Kafka clusters often refuse to create topics on first use (``auto.create.topics.enable``
is off), and a topic created that way gets the cluster's default partition count, not
the one configured. So estafeta asks for the cluster's topic list (which never creates
anything) and creates the missing ones itself, with the configured partitions,
replication and ``min.insync.replicas``; a topic that exists is used as it is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # documented there, not re-exported in its stubs
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL
from dramatiq.common import dq_name, q_name, xq_name

from .kafka_config import ClientLog, KafkaConfig, check_topic_name

logger = logging.getLogger(__name__)

#: Errors that mean "the cluster could not be asked", not "the cluster said no".
UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.NOT_CONTROLLER,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE,
}
#: Errors that mean "the cluster cannot take this write now", a state of the cluster and
#: never of the record: fewer in-sync replicas than the topic's ``min.insync.replicas``
#: (before or after the leader appended it), a partition without a leader or a replica, a
#: broker's disk failing, or no acknowledgement within the delivery timeout (librdkafka
#: retries all of these until then, unless ``retries`` is lowered). Like an unreachable
#: cluster, they leave the record to be produced again later, counting nothing against it.
UNAVAILABLE = {
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
}


class KafkaUnavailable(Exception):
    """The Kafka cluster could not be reached (no verdict on any queue)."""


def queue_topics(queue_name: str) -> list[str]:
    """A queue's three Dramatiq queue names: the queue, its delay queue and its dead letters."""
    canonical = q_name(queue_name)
    return [canonical, dq_name(canonical), xq_name(canonical)]


def is_unreachable(error: KafkaError) -> bool:
    """Whether ``error`` means the cluster (or a partition leader) could not be reached or cannot take writes now.

    Delivery reports never carry librdkafka's ``retriable`` flag, so the codes are listed.
    """
    code = error.code()
    return code in UNREACHABLE or code in UNAVAILABLE or (error.retriable() and not error.fatal())


class TopicDeclarer:
    """Creates the missing topics of queues, once per queue per process; thread-safe."""

    def __init__(self, config: KafkaConfig, timeout: float = 10.0) -> None:
        self.config = config
        self.timeout = timeout
        #: Canonical queue names whose topics are known to exist.
        self.declared: set[str] = set()
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def declare(self, queue_names: Iterable[str], *, timeout: float | None = None) -> dict[str, str]:
        """Ensure the topics of ``queue_names`` exist; return the queues refused, with the reason.

        Each request to the cluster waits at most ``timeout`` seconds, if given, and the
        declarer's own ``timeout``. Raises :class:`KafkaUnavailable` when the cluster cannot be asked.
        """
        wait = self.timeout if timeout is None else min(self.timeout, timeout)
        with self._lock:
            missing = sorted({q_name(q) for q in queue_names} - self.declared)
            if not missing:
                return {}
            refused = {q: why for q in missing if (why := self._invalid(q))}
            wanted = {self.config.topic(name): q for q in missing if q not in refused for name in queue_topics(q)}
            existing = self._existing_topics(wait)
            refused.update(self._create([t for t in wanted if t not in existing], wanted, wait))
            self.declared.update(q for q in missing if q not in refused)
            return refused

    def forget(self, queue_name: str | None = None) -> None:
        """Check ``queue_name``'s topics (all, if ``None``) again next time: one may be gone."""
        with self._lock:
            if queue_name is None:
                self.declared.clear()
            else:
                self.declared.discard(q_name(queue_name))

    def _invalid(self, queue_name: str) -> str | None:
        for name in queue_topics(queue_name):
            why = check_topic_name(self.config.topic(name))
            if why:
                return why
        return None

    def _client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.config.admin_config(), logger=ClientLog(logger))
        return self._admin

    def _existing_topics(self, timeout: float) -> set[str]:
        try:
            metadata = self._client().list_topics(timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(f"cannot reach Kafka at {self.config.bootstrap}: {error_text(exc)}") from None
        return set(metadata.topics)

    def _create(self, topics: list[str], queue_of: dict[str, str], timeout: float) -> dict[str, str]:
        if not topics:
            return {}
        futures = self._client().create_topics(
            [self._new_topic(topic) for topic in topics],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        refused = {}
        for topic, future in futures.items():
            try:
                future.result()
                logger.info("created Kafka topic %s (%d partitions)", topic, self.config.partitions)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # another process created it meanwhile
                if is_unreachable(error):
                    raise KafkaUnavailable(f"cannot create topic {topic!r}: {error_text(exc)}") from None
                refused[queue_of[topic]] = f"Kafka refused to create topic {topic!r}: {error_text(exc)}"
                logger.warning("%s", refused[queue_of[topic]])
        return refused

    def _new_topic(self, topic: str) -> NewTopic:
        # Dead letters are kept as long as Dramatiq keeps them on its other brokers.
        config = {"retention.ms": str(DEAD_MESSAGE_TTL)} if topic.endswith(".XQ") else {}
        if self.config.min_insync_replicas is not None:
            # How many copies acks=all waits for; without it, the cluster's default (Kafka's is 1).
            config["min.insync.replicas"] = str(self.config.min_insync_replicas)
        return NewTopic(
            topic,
            num_partitions=self.config.partitions,
            replication_factor=self.config.replication_factor,
            config=config,
        )


def error_text(exc: KafkaException) -> str:
    """The librdkafka error in ``exc``, as one line."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
