"""Choreography, for the short flows the seeds prefer it for: no orchestrator, only events.

A customer registers -> the bonus service activates a welcome bonus -> the mailer sends
the welcome mail (and the customers service records the bonus). Each service reacts to
the previous one's event in its own transaction, publishing its own event through its
outbox; the saga id of the registration travels in every message.

An app of its own, built only on estafeta: ``python -m examples.welcome`` runs it
(embedded PostgreSQL and the StubBroker by default); on RabbitMQ or Redis, serve it with
``dramatiq examples.welcome`` and manage it with ``estafeta --app examples.welcome
migrate|relay|outbox stats``. Importing this package binds the app to the broker of the
``ESTAFETA_*`` settings, as ``dramatiq`` needs.
"""

from __future__ import annotations

from .flow import app

#: The welcome app bound to this process's broker.
binding = app.bind()

__all__ = ["app", "binding"]
