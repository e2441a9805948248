"""Recurring schedules: when their ticks fall, and firing each tick once whatever workers run and crash.

Internal: apps import what they need from :mod:`estafeta` itself."""
