"""``dramatiq examples.shelf_django.worker``: the Django project's steps, on Django's connection of each thread.

``DJANGO_SETTINGS_MODULE=examples.shelf_django.settings`` and the ``ESTAFETA_*`` settings
(the database must be Django's).
"""

from __future__ import annotations

import os

import django

# A worker thread keeps its connection from step to step (settings.py reads it).
os.environ.setdefault("DJANGO_CONN_MAX_AGE", "600")
django.setup()

from estafeta import Runtime, Settings  # noqa: E402
from estafeta import django as es  # noqa: E402

from .steps import app  # noqa: E402

broker = app.bind(runtime=Runtime(Settings.from_env(), step_connections=es.step_connections())).broker
broker.add_middleware(es.CloseConnections())
