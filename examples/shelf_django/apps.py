"""The Django app config of :mod:`examples.shelf_django`."""

from __future__ import annotations

from django.apps import AppConfig


class ShelfConfig(AppConfig):
    """The shelf's Django models."""

    name = "examples.shelf_django"
    label = "shelf_django"
