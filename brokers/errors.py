"""Errors of the messaging layer."""

from __future__ import annotations

from estafeta_sql.errors import EstafetaError


class BrokerUnavailable(EstafetaError):
    """The broker could not be reached; pending outbox rows stay pending."""
