"""What is wrong with a DSN that libpq cannot use, said in words a user can act on, without its password."""

from __future__ import annotations

import re

#: The schemes libpq accepts for a connection URI.
SCHEMES = ("postgresql", "postgres")
#: The shape of a connection URI, for a message that shows one.
_URL_FORM = "postgresql://user:password@host:5432/dbname"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# Up to the last "@": a password may hold "/", "?" or "@" unencoded, and hiding too much is safe.
_URL_PASSWORD = re.compile(r"(://[^:/@?]*:).*@")
_PAIR_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def masked(dsn: str) -> str:
    """``dsn`` with its password (in the URL's user part, its query, or a ``password=`` pair) as ``***``."""
    return _PAIR_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", dsn))


def shape_error(dsn: str) -> str | None:
    """Why ``dsn`` is neither a PostgreSQL URL nor ``key=value`` pairs, or ``None`` if it has either shape."""
    scheme = _SCHEME.match(dsn)
    if scheme and "=" not in dsn[: scheme.end()] and (dsn[scheme.end() :].startswith("//") or "=" not in dsn):
        if scheme.group(1).lower() not in SCHEMES:
            return (
                f"the scheme {scheme.group(1)!r} of {masked(dsn)} is not postgresql:// (nor postgres://):"
                f" write {_URL_FORM}"
            )
        return None
    if "=" not in dsn:
        return f"neither a URL ({_URL_FORM}) nor key=value pairs (host=db port=5432 dbname=shop user=app)"
    return None


def parse_error(libpq_message: str) -> str:
    """libpq's complaint about a DSN's ``key=value`` pairs, without the fragment it quotes (it may be the password)."""
    if libpq_message.startswith('missing "'):  # 'missing "=" after "…"', its quotes already scrubbed
        return "a word without '=' among its key=value pairs: quote a value that holds spaces (password='…')"
    return libpq_message


def port_error(port: str, dsn: str) -> str | None:
    """Why ``port`` (one of a DSN's) is not a TCP port, or ``None`` if it is one (an empty one is the default)."""
    port = port.strip()
    if not port:
        return None
    if not port.isdigit():
        # Not the port itself: libpq reads an unencoded "/" in a URL's password as the end of its
        # host and port, so the "port" may be part of the password.
        return f"a port of {masked(dsn)} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"port {port} of {masked(dsn)} is not a TCP port (1-65535)"
    return None
