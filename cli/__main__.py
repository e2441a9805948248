"""``python -m cli``: the same as the ``estafeta`` command."""

from .main import main

main()
