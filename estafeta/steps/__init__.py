"""Steps: a Dramatiq actor whose every message is one PostgreSQL transaction, and what that transaction does.

Internal: apps import what they need from :mod:`estafeta` itself."""
