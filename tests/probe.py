"""The probe service: test-only steps, in a schema of their own (``tests/migrations/probe``)."""

from __future__ import annotations

from pathlib import Path

from estafeta import Service

#: The service the test-only steps are declared on.
SERVICE = Service("probe", migrations=Path(__file__).parent / "migrations" / "probe")
