"""Commands and events as JSON, the outbox API, hand-offs, wake-ups and assembling relays.

Internal: apps import what they need from :mod:`estafeta` itself."""
