"""Prometheus metrics of steps and their locks (the relay's are in ``estafeta_brokers.metrics``, the sagas' elsewhere).

Every name starts with ``estafeta_``. In ``dramatiq`` worker processes these are written
to prometheus_client's multiprocess files and served, summed over the processes, on
``ESTAFETA_METRICS_PORT`` (:mod:`estafeta.observability.worker_metrics`).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

#: Step durations: most take milliseconds; a lock wait or a slow database shows in the tail.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: Deliveries by actor and outcome: ok, failed (business failure), duplicate (the inbox had
#: it), dead_lettered, error (raised for Dramatiq to retry).
STEPS = Counter("estafeta_step_deliveries", "Step deliveries by outcome", ["actor", "outcome"])
#: From the start of a delivery to its outcome, the transaction's commit included.
STEP_DURATION = Histogram(
    "estafeta_step_duration_seconds",
    "Seconds one delivery to a step took, its transaction's commit included",
    ["actor"],
    buckets=DURATION_BUCKETS,
)
#: Waits for the step's lock (``lock=``), acquired ones.
LOCK_WAIT = Histogram(
    "estafeta_lock_wait_seconds", "Seconds a step waited for its lock", ["actor"], buckets=DURATION_BUCKETS
)
#: Lock waits that ran out (``ESTAFETA_LOCK_TIMEOUT_MS``): the delivery is retried later.
LOCK_TIMEOUTS = Counter("estafeta_lock_timeouts", "Step lock waits that timed out", ["actor"])
#: Deliveries after one that died unfinished, run alone in their process (``estafeta.steps.alone``).
ALONE = Counter(
    "estafeta_step_deliveries_alone", "Step deliveries run alone after an earlier delivery died unfinished", ["actor"]
)
#: Hand-offs (``estafeta.messaging.handoff``): ``done`` (the next step ran in the thread), ``relayed``
#: (a relay had its row first) or ``failed`` (its transaction rolled back; a relay publishes it).
HANDOFFS = Counter(
    "estafeta_step_handoffs", "Messages handed straight to the next step in the worker thread", ["actor", "outcome"]
)


def observe_delivery(actor: str, outcome: str, seconds: float) -> None:
    """Count one delivery's outcome and its duration."""
    STEPS.labels(actor, outcome).inc()
    STEP_DURATION.labels(actor).observe(seconds)
