"""``python -m ingest.cli``: the ``ingest`` command."""

from ingest.cli.commands import main

main()
