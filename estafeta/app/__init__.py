"""Apps and services as a team declares them, their settings, and binding them to a broker with a runtime.

Internal: apps import what they need from :mod:`estafeta` itself."""
