"""A TCP proxy a test can stop and start again: a server that goes away for the clients behind it only.

The machine's PostgreSQL is shared and must never be stopped; a service whose DSN points at
this proxy loses its database when the test calls :meth:`TcpProxy.stop` (the listening
socket closes, so new connections are refused, and every open connection is cut), and gets
it back, on the same port, with :meth:`TcpProxy.start`.

    with TcpProxy("127.0.0.1", 5432) as proxy:
        dsn = make_conninfo(database_url, host="127.0.0.1", port=proxy.port)
        proxy.stop()   # the database is gone for `dsn`
        proxy.start()  # and back
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType

from .services import free_port


class TcpProxy:
    """Forwards every connection to ``port`` (a free one) to ``target_host:target_port`` while started."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Accept connections on :attr:`port` again (no-op if started)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="tcp-proxy-accept", daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut every open one (no-op if stopped)."""
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in open_sockets:
            # Shut down, not closed: its pipe thread wakes up, sees the end and closes it.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream), name="tcp-proxy-pipe", daemon=True).start()

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in selector.select(timeout=1.0):
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        peers[key.fileobj].sendall(data)  # type: ignore[index]
            except (OSError, ValueError):
                return  # cut by stop(), or closed by a peer
            finally:
                with self._lock:
                    self._sockets -= {client, upstream}
                for sock in peers:
                    sock.close()
