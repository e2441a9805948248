"""An embedded PostgreSQL (pgserver) for running estafeta with nothing installed."""

from __future__ import annotations

import os
from pathlib import Path

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
    server = pgserver.get_server(str(path), cleanup_mode="stop")  # type: ignore[attr-defined]
    return str(server.get_uri())
