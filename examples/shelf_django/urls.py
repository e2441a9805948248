"""The shelf's routes: ``POST /items``."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [path("items", views.place_item)]
