"""The command tree: every command that talks to Kafka takes kcat's client settings (so it
reaches a TLS or SASL cluster), and the development commands live in ``eoguard-dev`` alone."""

from __future__ import annotations

from collections.abc import Iterator

import click

from eoguard.cli import cli
from eoguard.cli.dev import dev

KAFKA_COMMANDS = {"browse", "outbox resend", "dlq list", "dlq replay"}
"""The commands that talk to Kafka (each one reads or produces records); the rest talk to Redis
alone. A new command that talks to Kafka goes here, and the test holds it to the options."""
KAFKA_OPTIONS = {"-b", "--bootstrap-servers", "-F", "--client-config", "-X"}


def commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        full = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            yield from commands(command, full)
        else:
            yield full, command


def flags(command: click.Command) -> set[str]:
    return {flag for param in command.params for flag in getattr(param, "opts", ())}


def test_every_kafka_command_takes_the_client_config_file_and_x() -> None:
    tree = dict(commands(cli))
    assert tree.keys() >= KAFKA_COMMANDS
    missing = {name: sorted(KAFKA_OPTIONS - flags(tree[name])) for name in KAFKA_COMMANDS}
    assert missing == {key: [] for key in KAFKA_COMMANDS}
    others = {name for name, command in tree.items() if flags(command) & KAFKA_OPTIONS}
    assert others == KAFKA_COMMANDS  # none takes half of them, none is unlisted


def test_every_command_takes_json() -> None:
    for group in (cli, dev):
        assert "--json" in flags(group)
        assert [name for name, command in commands(group) if "--json" not in flags(command)] == []


def test_the_development_commands_are_eoguard_dev_alone() -> None:
    assert {name.split()[0] for name, _ in commands(dev)} == {"stack", "demo"}
    assert not {"stack", "demo"} & cli.commands.keys()
