"""``eoguard-dev stack up|down|status``: the local Kafka + Redis + Schema Registry stack
(eoguard.stack.LocalStack)."""

from __future__ import annotations

import click

from eoguard.cli import render
from eoguard.cli.context import CliContext, json_option, pass_cli
from eoguard.stack import LocalStack
from eoguard.stack.local import TOPOLOGIES


@click.group()
@click.option("--topology", type=click.Choice(TOPOLOGIES), default=None,
              help="single (default, or EOGUARD_TOPOLOGY): one Kafka, one Redis; cluster: three "
                   "Kafka nodes and a Redis Cluster of three masters with a replica each.")
@click.pass_context
def stack(ctx: click.Context, topology: str | None) -> None:
    """The local stack: Kafka (KRaft), Redis (AOF) and a Schema Registry (Apicurio Registry,
    Confluent-compatible API), for the demo and the tests.

    EOGUARD_KAFKA_BOOTSTRAP / EOGUARD_REDIS_URL / EOGUARD_SCHEMA_REGISTRY_URL
    (EOGUARD_CLUSTER_... for --topology cluster) name services to reuse instead; the stack then
    starts and stops nothing of its own for them.
    """
    ctx.meta["eoguard.topology"] = topology


def _local() -> LocalStack:
    return LocalStack(topology=click.get_current_context().meta.get("eoguard.topology"))


@stack.command()
@json_option
@pass_cli
def up(cli: CliContext) -> None:
    """Start Kafka, Redis and the Schema Registry unless they already run (idempotent); print
    their endpoints."""
    local = _local()
    with render.err_console().status("starting the local stack (Kafka: ~20 s; cluster: ~30 s)...") as status:
        if cli.as_json:
            status.stop()
        ends, started = local.up()
    env = ends.shown_env()
    data = {"kafka_bootstrap": ends.kafka_bootstrap, "redis_url": env["EOGUARD_REDIS_URL"],
            "schema_registry_url": env.get("EOGUARD_SCHEMA_REGISTRY_URL"), "started": started,
            "env": env}
    render.show(cli, data, render.key_values("local stack", {
        "kafka": ends.kafka_bootstrap,
        "redis": env["EOGUARD_REDIS_URL"],
        "schema registry": env.get("EOGUARD_SCHEMA_REGISTRY_URL", "-"),
        "started now": ", ".join(started) or "nothing (already running)",
    }))


@stack.command()
@click.option("--clean", is_flag=True,
              help="Also delete Kafka's log, Redis's data and the registry's schemas.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation with --clean.")
@click.option("--dry-run", is_flag=True, help="Say what would stop, stop nothing.")
@json_option
@pass_cli
def down(cli: CliContext, *, clean: bool, yes: bool, dry_run: bool) -> None:
    """Stop the services this stack started (services named by env vars are left alone)."""
    local = _local()
    managed = local.managed_services()
    action = "stop and DELETE the data of" if clean else "stop"
    if not dry_run and clean and not yes:
        click.confirm(f"{action} {', '.join(managed) or 'nothing'}?", abort=True, err=True)
    if not dry_run:
        local.down(clean=clean)
    data = {"stopped": [] if dry_run else managed, "would_stop": managed if dry_run else [],
            "cleaned": clean and not dry_run, "dry_run": dry_run}
    verb = "would " + action if dry_run else action.replace("stop", "stopped", 1)
    render.show(cli, data, f"{verb}: {', '.join(managed) or 'nothing (no managed service)'}")


@stack.command("status")
@json_option
@pass_cli
def stack_status(cli: CliContext) -> None:
    """Address, pid and readiness of each service (managed = started by this stack)."""
    services = _local().status()
    rows = [[name, s["address"], s["managed"], str(s["pid"] or "-"), s["ready"], s["log"]]
            for name, s in services.items()]
    render.show(cli, services,
                render.table("local stack", ["service", "address", "managed", "pid", "ready", "log"], rows))
