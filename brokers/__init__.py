"""Messaging, broker-agnostic: a Dramatiq broker from a URL, and the relay that drains outboxes."""

from __future__ import annotations

import importlib.util
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage

from .liveness import with_liveness

#: URL schemes ``broker_from_url`` understands.
SCHEMES = ("stub", "amqp", "amqps", "redis", "rediss", "kafka")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, fit for logs and error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = [name for name, _ in query if _is_secret(name)]
    if parts.password is None and not secret:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        # The hosts as written: a kafka:// URL lists several, which parts.port rejects.
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    if secret:
        query = [(name, "***" if _is_secret(name) else value) for name, value in query]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


def _is_secret(name: str) -> bool:
    return "password" in name or "secret" in name


def amqp_urls(url: str) -> list[str]:
    """One URL per host of an ``amqp://`` URL naming several: ``amqp://u:p@h1:5673,h2:5674/vhost``.

    Each keeps the credentials, vhost and query; a host without a port gets the scheme's
    default. The workers and the relay connect to the first that answers, in this order,
    and fail over to the next when their connection is lost.
    """
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [url]
    return [urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host.strip()}")) for host in hosts.split(",")]


def check_url(url: str) -> None:
    """Raise ``ValueError`` with a reason if ``url`` is not a broker URL estafeta can use."""
    try:
        parts = urlsplit(url)
        hosts = [urlsplit(one) for one in amqp_urls(url)] if parts.scheme in ("amqp", "amqps") else [parts]
        if parts.scheme != "kafka":
            ports = [host.port for host in hosts]  # raises for a non-numeric port
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if parts.scheme != "kafka" and len(ports) > 1 and not all(host.hostname for host in hosts):
        raise ValueError(f"a host is empty in {redact_url(url)}")
    if parts.scheme not in SCHEMES:
        expected = ", ".join(f"{s}://" for s in SCHEMES)
        raise ValueError(f"unknown scheme {parts.scheme!r} in {redact_url(url)} (expected {expected})")
    if parts.scheme == "kafka":
        from .kafka_config import parse_kafka_url

        parse_kafka_url(url)
        if importlib.util.find_spec("confluent_kafka") is None:
            raise ValueError("kafka:// needs confluent-kafka, which is not installed: pip install 'estafeta[kafka]'")
        return
    if parts.scheme != "stub" and not parts.hostname:
        raise ValueError(f"no host in {redact_url(url)}")
    wait_replicas(url)


def _split_query(url: str, name: str) -> tuple[str, str | None]:
    """``url`` without its query parameter ``name``, and that parameter's value."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    value = next((v for key, v in query if key == name), None)
    rest = urlencode([(key, v) for key, v in query if key != name])
    return urlunsplit(parts._replace(query=rest)), value


def split_namespace(url: str) -> tuple[str, str | None]:
    """Take the ``namespace`` query parameter (the Redis key prefix) out of a Redis URL.

    ``redis://host:6379/0?namespace=shop`` lets several applications (or test runs)
    share one Redis database; redis-py itself would reject the unknown parameter.
    """
    return _split_query(url, "namespace")


def wait_replicas(url: str) -> int:
    """The ``wait`` query parameter of a Redis URL: replicas that must hold a batch before it counts as confirmed.

    ``redis://host:6379/0?wait=1`` makes the relay run ``WAIT 1`` after each batch: a
    batch the replicas did not acknowledge within the confirm timeout stays in the outbox
    and is published again (the consumers' inbox absorbs the copies). 0 (the default):
    confirmed once in the primary's memory. ``ValueError`` for a bad value or another scheme.
    """
    _, value = _split_query(url, "wait")
    if value is None:
        return 0
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise ValueError(f"the wait parameter is for Redis URLs only, not {redact_url(url)}")
    if not value.isdigit():
        raise ValueError(f"wait={value!r} in {redact_url(url)} is not a number of replicas")
    return int(value)


def broker_from_url(
    url: str, *, queue_type: str = "classic", delivery_limit: int | None = None, **options: Any
) -> dramatiq.Broker:
    """A Dramatiq broker for ``url``: ``stub://``, ``amqp://...``, ``redis://...[?namespace=prefix]`` or ``kafka://...``.

    An ``amqp://`` URL may name the nodes of a cluster: ``amqp://u:p@h1:5672,h2:5672/vhost``
    (:func:`amqp_urls`).

    RabbitMQ brokers confirm every publish (``confirm_delivery``), so a message the
    broker did not take raises instead of vanishing, and declare their queues as
    ``queue_type`` says (``classic``: Dramatiq's own; ``quorum``: replicated, with
    ``delivery_limit``; see :mod:`estafeta_brokers.rabbitmq_queues`). RabbitMQ and Redis connections
    get the timeouts of :mod:`estafeta_brokers.liveness` unless the URL sets them. Every broker carries the
    ``CurrentMessage`` middleware, which steps need to read their message id.
    """
    check_url(url)
    scheme = urlsplit(url).scheme
    if queue_type != "classic" and scheme not in ("amqp", "amqps"):
        raise ValueError(f"{queue_type} queues are RabbitMQ's: not for {redact_url(url)}")
    broker: dramatiq.Broker
    if scheme == "stub":
        broker = StubBroker(**options)
    elif scheme == "kafka":
        from .kafka import KafkaBroker
        from .kafka_config import parse_kafka_url

        broker = KafkaBroker(parse_kafka_url(url), **options)
    elif scheme in ("amqp", "amqps"):
        from .rabbitmq_queues import QueueDeclarations, QueueTypedRabbitmqBroker

        declarations = QueueDeclarations(queue_type, delivery_limit, options.pop("max_priority", None))
        # Several hosts: pika tries them in order, on every (re)connection.
        broker = QueueTypedRabbitmqBroker(
            url=[with_liveness(one) for one in amqp_urls(url)],
            confirm_delivery=True,
            declarations=declarations,
            **options,
        )
    else:
        from dramatiq.brokers.redis import RedisBroker

        url, namespace = split_namespace(url)
        url, _ = _split_query(url, "wait")  # the relay's business (wait_replicas), not redis-py's
        if namespace:
            options.setdefault("namespace", namespace)
        broker = RedisBroker(url=with_liveness(url), **options)  # type: ignore[no-untyped-call]
    if not any(isinstance(m, CurrentMessage) for m in broker.middleware):
        broker.add_middleware(CurrentMessage())
    return broker
