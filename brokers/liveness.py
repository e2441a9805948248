"""How long a broker connection may stay silent before its client gives up on it.

A network that drops packets without a word sends no RST: a client without timeouts of
its own waits for the kernel's TCP timeout (15 minutes or more) on a dead connection. So
every broker URL gets these settings unless it sets them itself (its query string wins):

- RabbitMQ (pika): ``heartbeat`` 15 s: pika checks every heartbeat + 5 s whether anything
  arrived since its last check and closes the connection when nothing did, so a silent
  broker is noticed within 2 x (15 + 5) = 40 s; ``blocked_connection_timeout`` 30 s: a publisher the broker
  blocked (memory or disk alarm) fails instead of waiting for the alarm to clear.
- Redis (redis-py): ``socket_timeout`` 5 s on every command, ``socket_connect_timeout``
  5 s, TCP keepalives, and a ``PING`` before reusing a connection idle for 15 s. redis-py
  8 has the same timeouts by default; redis-py 5 to 7 (which estafeta also supports) have
  none: a command sent into a silent link waited forever.
- Kafka (librdkafka): see :data:`estafeta_brokers.kafka_config.COMMON_DEFAULTS`.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: Query parameters of ``amqp://`` URLs (pika's ``URLParameters``) set unless the URL sets them.
AMQP_DEFAULTS = {"heartbeat": "15", "blocked_connection_timeout": "30"}
#: Query parameters of ``redis://`` URLs (redis-py's ``from_url``) set unless the URL sets them.
REDIS_DEFAULTS = {
    "socket_timeout": "5",
    "socket_connect_timeout": "5",
    "socket_keepalive": "true",
    "health_check_interval": "15",
}
#: Seconds within which a broker connection whose peer went silent fails, per client: what
#: the documentation promises (RabbitMQ: two of pika's heartbeat checks; Redis: one
#: command's socket timeout).
SILENT_FAILURE_BOUND = {"amqp": 40, "redis": 5}


def with_liveness(url: str) -> str:
    """``url`` (one or several, ``;``-separated, for RabbitMQ) with the defaults of its scheme."""
    scheme = urlsplit(url).scheme
    if scheme in ("amqp", "amqps"):
        return ";".join(_with_query_defaults(part, AMQP_DEFAULTS) for part in url.split(";"))
    if scheme in ("redis", "rediss"):
        return _with_query_defaults(url, REDIS_DEFAULTS)
    return url


def _with_query_defaults(url: str, defaults: dict[str, str]) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = {name for name, _ in query}
    query += [(name, value) for name, value in defaults.items() if name not in given]
    return urlunsplit(parts._replace(query=urlencode(query)))
