"""Tests of the event store, aggregates and projections (fixtures in conftest.py)."""
