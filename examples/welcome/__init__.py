"""Choreography, for the short flows the seeds prefer it for: no orchestrator, only events.

A customer registers -> the bonus service activates a welcome bonus -> the mailer sends
the welcome mail (and the customers service records the bonus). Each service reacts to
the previous one's event in its own transaction, publishing its own event through its
outbox; the saga id of the registration travels in every message.

Run it with ``python -m examples.welcome`` (embedded PostgreSQL and the StubBroker by
default; on RabbitMQ or Redis run ``dramatiq examples.welcome.flow`` next to it).
"""
