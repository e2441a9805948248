"""The order system's migrations: one directory of numbered ``.sql`` files per service."""

from pathlib import Path

#: ``MIGRATIONS / "<service>"`` holds that service's migrations.
MIGRATIONS = Path(__file__).parent
