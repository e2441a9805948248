"""Sagas: their declaration, the orchestrator that moves them, and the watchdog that moves the overdue ones.

Internal: apps import what they need from :mod:`estafeta` itself."""
