"""The HTTP Idempotency-Key in the request's own transaction, and problems (RFC 9457) as plain values.

Internal: apps import what they need from :mod:`estafeta` itself."""
