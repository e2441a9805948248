"""What the runtime tells its operator: log lines, spans, and Prometheus metrics.

Internal: apps import what they need from :mod:`estafeta` itself."""
