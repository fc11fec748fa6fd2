"""``python -m cproxy ...``: the same as the ``cproxy`` command."""

from cproxy.cli import main

main()
