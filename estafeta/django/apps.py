"""The Django app of ``estafeta.django``: no models, no Django migrations (``estafeta migrate`` makes its tables)."""

from __future__ import annotations

from django.apps import AppConfig


class EstafetaConfig(AppConfig):
    """``INSTALLED_APPS = [..., "estafeta.django"]``."""

    name = "estafeta.django"
    label = "estafeta"
    verbose_name = "estafeta"
