"""The Kafka client options every command that talks to Kafka takes, as kcat spells them.

``--bootstrap-servers`` (or ``EOGUARD_KAFKA_BOOTSTRAP``; the local stack's by default), then
``-F FILE`` (a client properties file: ``key=value`` lines, ``#`` comments), then each
``-X key=value`` (repeatable): each later one wins. The result is the librdkafka
configuration, so the command reaches a TLS or SASL cluster (SASL credentials may also come
from the environment, see :mod:`eoguard.credentials`). Secret values are never printed:
:func:`shown` redacts them, and librdkafka's refusals are scrubbed of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from eoguard.cli.context import BadInputError
from eoguard.redaction import redact

F = TypeVar("F", bound=Callable[..., Any])


def default_bootstrap() -> str:
    """The local stack's Kafka (the stack honours ``EOGUARD_KAFKA_BOOTSTRAP`` too)."""
    from eoguard.stack import LocalStack  # noqa: PLC0415 - only commands that talk to Kafka

    return LocalStack().endpoints().kafka_bootstrap


def kafka_options(f: F) -> F:
    """Decorator: ``--bootstrap-servers``/``-b``, ``-F/--client-config`` and ``-X``, passed
    to the command as ``bootstrap_servers``, ``config_file`` and ``overrides`` (for
    :func:`kafka_config`)."""

    options = [
        click.option("--bootstrap-servers", "-b", envvar="EOGUARD_KAFKA_BOOTSTRAP", show_envvar=True,
                     default=None, metavar="HOSTS",
                     help="Kafka brokers [default: the local stack's, 127.0.0.1:19092]."),
        click.option("--client-config", "-F", "config_file", default=None, metavar="FILE",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="Kafka client properties (key=value lines, # comments; kcat's -F), "
                          "e.g. security.protocol, sasl.*, ssl.*."),
        click.option("-X", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="One librdkafka setting (repeatable; wins over -F)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def kafka_config(bootstrap_servers: str | None, config_file: Path | None,
                 overrides: tuple[str, ...]) -> dict[str, str]:
    """The librdkafka configuration the options name (see the module docstring for the order)."""
    conf = {"bootstrap.servers": bootstrap_servers or default_bootstrap()}
    if config_file is not None:
        conf.update(read_properties(config_file))
    for text in overrides:
        key, value = _pair(text, where="-X")
        conf[key] = value
    return conf


def read_properties(path: Path) -> dict[str, str]:
    """``key=value`` lines of a client properties file; blank lines and ``#`` comments skipped.

    A malformed line is reported by its number only: it may hold a secret.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"-F {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})"
                            ) from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, value = _pair(line, where=f"-F {path}, line {number}", show=False)
        out[key] = value
    return out


def _pair(text: str, *, where: str, show: bool = True) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        secret = redact({text: text})[text] != text
        quoted = f" {text!r}" if show and not secret else ""
        raise BadInputError(f"{where}:{quoted} not a key=value setting")
    return key, value.strip()


def shown(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` fit to print: secret values redacted, callbacks left out."""
    return redact({k: v for k, v in conf.items() if not callable(v)})
