"""``eoguard-dev``: the development commands, apart from the production CLI (``eoguard``).

``eoguard-dev stack up|down|status`` starts and stops the local Kafka, Redis and Schema
Registry (installing Debian's redis-server as root when it is missing) and ``eoguard-dev
demo`` runs the end-to-end demo on it: neither belongs on a production host, where ``eoguard``
inspects and repairs a deployment and starts nothing. ``python -m eoguard.stack`` does the
stack's part without click.
"""

from __future__ import annotations

import click

from eoguard.cli import demo, stack
from eoguard.cli.context import CliContext, EoguardGroup, redis_url_option
from eoguard.store.keys import DEFAULT_PREFIX


@click.group(cls=EoguardGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit codes: 0 ok; 1 the operation failed (a service did not start, a "
                    "demo invariant broke); 2 bad input.")
@redis_url_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables.")
@click.version_option(package_name="eoguard", prog_name="eoguard-dev")
@click.pass_context
def dev(ctx: click.Context, redis_url: str | None, as_json: bool) -> None:
    """Development only: the local stack (Kafka, Redis, Schema Registry) and the demo."""
    CliContext.start(ctx, redis_url, prefix=DEFAULT_PREFIX, shards=None, as_json=as_json)


for _command in (stack.stack, demo.demo):
    dev.add_command(_command)


def main() -> None:
    """Console-script entry point (``eoguard-dev = "eoguard.cli.dev:main"``)."""
    dev(prog_name="eoguard-dev")
