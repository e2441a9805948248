"""Listening sockets bound before a server announces itself: a busy port or a bad host is one line, exit 2."""

from __future__ import annotations

import errno
import socket

import click


def bind(host: str, port: int, *, host_option: str = "--host", port_option: str = "--port") -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening; a usage error naming the option that is wrong.

    As uvicorn binds (``SO_REUSEADDR``, IPv6 when the host has a colon), so that a server
    handed this socket listens exactly where it would have.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's backlog
    except socket.gaierror as exc:
        sock.close()
        raise click.BadParameter(
            f"cannot listen on {shown}: {host!r} is not a known host ({exc.strerror})", param_hint=host_option
        ) from None
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise click.BadParameter(
                f"{shown} is in use (another process listens there): stop it or choose another {port_option}",
                param_hint=port_option,
            ) from None
        if exc.errno == errno.EACCES:
            raise click.BadParameter(
                f"cannot listen on {shown}: permission denied (ports below 1024 need privileges)",
                param_hint=port_option,
            ) from None
        raise click.BadParameter(
            f"cannot listen on {shown}: {exc.strerror} (an address of this machine, or 0.0.0.0 for all)",
            param_hint=host_option,
        ) from None
    return sock
