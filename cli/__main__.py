"""``python -m estafeta_cli``: the same as the ``estafeta`` command."""

from .main import main

main()
