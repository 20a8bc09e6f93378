"""``python -m aegis_cli``: the ``aegis`` command."""

from aegis_cli.app import main

main()
