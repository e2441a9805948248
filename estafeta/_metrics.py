"""Prometheus metrics of steps (the relay's live in ``brokers.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

#: Deliveries by actor and outcome: ok, failed (business failure), duplicate, dead_lettered, error.
STEPS = Counter("estafeta_step_deliveries", "Step deliveries by outcome", ["actor", "outcome"])
