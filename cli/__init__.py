"""The ``estafeta`` command line (click)."""
