"""Locks that serialise steps on one key: PostgreSQL transaction locks, or Redis leases with fencing tokens.

Internal: apps import what they need from :mod:`estafeta` itself."""
