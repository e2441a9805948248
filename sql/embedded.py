"""An embedded PostgreSQL (pgserver) for running estafeta with nothing installed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .errors import DatabaseUnavailable

#: Where ``ESTAFETA_DATABASE_URL=embedded`` keeps its data, relative to the working directory.
DEFAULT_DATA_DIR = Path(".estafeta") / "pgdata"


def start(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded PostgreSQL in ``data_dir`` and return its DSN.

    Several processes may call this for one data directory: pgserver shares one server
    between them and stops it when the last one exits.
    """
    path = (data_dir or DEFAULT_DATA_DIR).resolve()
    path.mkdir(parents=True, exist_ok=True)
    # pgserver warns (on import) when XDG_RUNTIME_DIR is unset; it only needs a private writable place.
    if "XDG_RUNTIME_DIR" not in os.environ:
        runtime_dir = path.parent / "run"
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime_dir)
    try:
        import pgserver
    except ImportError:
        raise DatabaseUnavailable(
            "ESTAFETA_DATABASE_URL=embedded needs pgserver: pip install 'estafeta[embedded]'"
        ) from None
    return str(_join_or_start(pgserver, path).get_uri())


def _join_or_start(pgserver: Any, path: Path, wait_s: float = 60.0) -> Any:
    """pgserver's server for ``path``, waiting out a server that another process is stopping.

    The last process to leave stops the shared server; one that arrives meanwhile finds its
    ``postmaster.pid`` saying "stopping" and pgserver fails an assertion (and caches the broken
    handle). That is a moment to wait, not an error: drop the handle and try again.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return pgserver.get_server(str(path), cleanup_mode="stop")
        except AssertionError:
            pgserver.PostgresServer._instances.pop(path, None)
            if time.monotonic() > deadline:
                raise DatabaseUnavailable(
                    f"the embedded PostgreSQL in {path} did not start within {wait_s:.0f} s: see {path / 'log'}"
                ) from None
            time.sleep(0.5)
