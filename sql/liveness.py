"""How long a PostgreSQL connection may stay silent before libpq gives up on it.

A network that drops packets without a word (a partition, a firewall that forgets a
connection, a host that vanished) sends no RST: without these settings, a connection
waiting for an answer waits for the kernel's TCP timeout, 15 minutes or more, and an idle
pooled connection never learns it is dead. With them, every connection estafeta opens
fails within a bounded time and the caller reconnects:

- ``connect_timeout`` bounds opening a connection (per host);
- ``tcp_user_timeout`` bounds how long data sent may stay unacknowledged (a statement
  sent into a cut link);
- TCP keepalives (``keepalives_idle``, ``keepalives_interval``, ``keepalives_count``)
  probe a connection that waits for an answer or sits idle in the pool.

Together: a connection cut off silently fails within :data:`SILENT_FAILURE_BOUND` seconds.

The server needs the same on its side (:func:`server_settings`, set on every pooled
connection): otherwise the session of a client that vanished keeps its transaction open,
and its row locks held, until the server's own TCP timeout (2 hours of keepalive idle by
default), blocking every transaction that needs those rows after the network heals. With
them, the server ends that session within the same bound, also in the middle of a
statement (``client_connection_check_interval``, PostgreSQL 14 and later).
A DSN that sets any of these keywords itself keeps its own value (so does a
``PGCONNECT_TIMEOUT`` environment variable, for ``connect_timeout``); libpq ignores them
on Unix-domain sockets, where no network can be cut.
"""

from __future__ import annotations

import os

import psycopg
from psycopg import conninfo

#: The libpq keywords estafeta sets when the DSN does not.
LIVENESS_DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

#: Seconds within which a connection whose peer went silent fails: ``tcp_user_timeout``
#: (Linux applies it to keepalive probes too) plus one probe interval.
SILENT_FAILURE_BOUND = 35


def with_liveness(dsn: str) -> str:
    """``dsn`` with :data:`LIVENESS_DEFAULTS` for every keyword it does not set itself.

    A DSN that libpq cannot parse is returned unchanged: connecting reports the error.
    """
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return dsn
    missing = {key: value for key, value in LIVENESS_DEFAULTS.items() if key not in params}
    if "PGCONNECT_TIMEOUT" in os.environ:
        missing.pop("connect_timeout", None)
    if not missing:
        return dsn
    return conninfo.make_conninfo(dsn, **missing)


#: The server's side of the same timeouts, for the session (``set_config``).
SERVER_LIVENESS: dict[str, str] = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def server_settings(server_version: int) -> dict[str, str]:
    """The session settings that make the server notice a silent client (``server_version`` as libpq reports it)."""
    settings = dict(SERVER_LIVENESS)
    if server_version >= 140000:
        # A statement in progress (a lock wait, a long query) checks that its client is still there.
        settings["client_connection_check_interval"] = "5s"
    return settings
