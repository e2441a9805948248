"""What an operator acts on: dead letters grouped by cause and replayed, and retention of the tables.

Internal: apps import what they need from :mod:`estafeta` itself."""
