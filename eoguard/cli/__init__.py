"""The ``eoguard`` command line: Redis inspection and repair, the local stack, the demo."""

from eoguard.cli.app import cli, main

__all__ = ["cli", "main"]
