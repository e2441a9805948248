"""Tests of estafeta.eventsourcing: the eventsourcing library's own recorder test cases, and apps end to end."""
