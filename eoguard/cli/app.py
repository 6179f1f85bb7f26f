"""The ``eoguard`` click group: global options and the command tree of the production CLI
(the local stack and the demo are ``eoguard-dev``'s, :mod:`eoguard.cli.dev`).

Every command reads Redis through the store wrappers (``eoguard.store``) with the KeySpace
built from ``--prefix``/``--shards``; no command spells a key name. User errors end the
command with ONE line on stderr and a non-zero exit code, never a traceback (see
:mod:`eoguard.cli.context` for the codes).
"""

from __future__ import annotations

import click

from eoguard.cli import browse, dedup, dlq, outbox, status
from eoguard.cli.context import BadInputError, CliContext, EoguardGroup, redis_url_option
from eoguard.errors import ConfigError
from eoguard.store.keys import DEFAULT_PREFIX, DEFAULT_SHARDS, KeySpace


def _check_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        KeySpace(prefix=value)
    except ConfigError as exc:
        raise BadInputError(f"--prefix: {exc}") from exc
    return value


@click.group(cls=EoguardGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit codes: 0 ok; 1 operation failed (Redis unreachable, wrong auth, "
                    "invariant broken); 2 bad input (usage, bad URL); 3 id not found.")
@redis_url_option
@click.option("--prefix", envvar="EOGUARD_PREFIX", default=DEFAULT_PREFIX, show_default=True,
              show_envvar=True, callback=_check_prefix, help="Key prefix the producers and consumers use.")
@click.option("--shards", envvar="EOGUARD_SHARDS", default=None, show_envvar=True,
              type=click.IntRange(1, 16384),
              help="Shard count of the key space [default: the one the prefix was first used "
                   f"with, recorded in Redis; {DEFAULT_SHARDS} for a new prefix].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables.")
@click.version_option(package_name="eoguard", prog_name="eoguard")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, prefix: str, shards: int | None,
        as_json: bool) -> None:
    """Inspect and repair eoguard's Redis state, browse topics, replay dead letters."""
    CliContext.start(ctx, redis_url, prefix=prefix, shards=shards, as_json=as_json)


for _command in (status.status, outbox.outbox, dedup.dedup, browse.browse, dlq.dlq):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point (``eoguard = "eoguard.cli:main"``)."""
    cli(prog_name="eoguard")
