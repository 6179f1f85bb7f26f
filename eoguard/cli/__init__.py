"""The ``eoguard`` command line: Redis inspection and repair, topics and dead letters; the
development commands (local stack, demo) are ``eoguard-dev`` (:mod:`eoguard.cli.dev`)."""

from eoguard.cli.app import cli, main

__all__ = ["cli", "main"]
