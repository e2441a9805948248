"""The event store, event types, aggregates and projections (read models built from the event log).

Internal: apps import what they need from :mod:`estafeta` itself."""
