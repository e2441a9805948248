"""Whether a broker answers now: one connection opened and closed, its failure in one line without secrets."""

from __future__ import annotations

from typing import Any

import dramatiq


class BrokerUnreachable(Exception):
    """The broker did not accept a connection (down, refused the login, or no such vhost)."""


def check_reachable(broker: dramatiq.Broker, timeout: float = 10.0) -> None:
    """Open and close one connection to ``broker``; raise :class:`BrokerUnreachable` with the reason if it fails.

    RabbitMQ: each of its nodes is tried in order, as the workers do; Redis: a ``PING``.
    Brokers with nothing to connect to (the StubBroker) and others (Kafka) pass.
    """
    parameters = getattr(broker, "parameters", None)
    if parameters is not None:
        _check_rabbitmq(parameters if isinstance(parameters, list) else [parameters], timeout)
        return
    client = getattr(broker, "client", None)
    if client is not None and hasattr(client, "ping"):
        _check_redis(client)


def _check_rabbitmq(parameters: list[Any], timeout: float) -> None:
    import copy

    import pika

    reasons = []
    for given in parameters:
        tried = copy.copy(given)
        tried.socket_timeout = tried.blocked_connection_timeout = timeout
        tried.connection_attempts = 1
        try:
            pika.BlockingConnection(tried).close()
            return
        except pika.exceptions.ProbableAuthenticationError:
            reasons.append(f"{given.host}:{given.port}: the login was refused (user or password)")
        except pika.exceptions.ProbableAccessDeniedError:
            reasons.append(f"{given.host}:{given.port}: no access to the vhost {given.virtual_host!r}")
        except pika.exceptions.AMQPConnectionError:
            reasons.append(f"{given.host}:{given.port}: no connection (nothing listens there, or it did not answer)")
        except pika.exceptions.AMQPError as exc:
            reasons.append(f"{given.host}:{given.port}: {_first_line(exc) or 'connection refused or lost'}")
        except OSError as exc:
            reasons.append(f"{given.host}:{given.port}: {exc.strerror or exc}")
    raise BrokerUnreachable("; ".join(reasons))


def _check_redis(client: Any) -> None:
    import redis

    try:
        client.ping()
    except redis.RedisError as exc:
        where = client.connection_pool.connection_kwargs
        raise BrokerUnreachable(f"{where.get('host')}:{where.get('port')}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
