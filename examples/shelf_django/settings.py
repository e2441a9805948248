"""Settings of the shelf's Django project (``DJANGO_SETTINGS_MODULE=examples.shelf_django.settings``).

The database is ``ESTAFETA_DATABASE_URL``'s, the one the shelf's workers and relay use; serve
the view with any WSGI server, ``django-admin runserver`` included.
"""

from __future__ import annotations

import os

import psycopg

_db = psycopg.conninfo.conninfo_to_dict(os.environ.get("ESTAFETA_DATABASE_URL", "postgresql:///shelf"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "shelf-example-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.shelf_django.urls"
INSTALLED_APPS = ["estafeta.django", "examples.shelf_django"]
MIDDLEWARE: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        # 0 (Django's default) for the web; the worker module keeps each thread's connection.
        "CONN_MAX_AGE": int(os.environ.get("DJANGO_CONN_MAX_AGE", "0")),
        "CONN_HEALTH_CHECKS": True,
    }
}
SHELF_CAPACITY = int(os.environ.get("SHELF_CAPACITY", "1000"))
USE_TZ = True
# A view's unhandled exception goes to stderr with its traceback (Django's default, with
# DEBUG off, only mails it to ADMINS: a 500 would leave no trace in the server's log).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}},
}
