"""``eoguard outbox resend [ID...|--stuck]``: resend through the producer's own recovery path.

The command runs a short-lived :class:`eoguard.GuardedProducer` (its own liveness lease, no
sends of its own) and calls :meth:`~eoguard.GuardedProducer.recover` (``--stuck``: what
recovery would take anyway) or :meth:`~eoguard.GuardedProducer.resend` (named ids). Claims are
atomic compare-and-sets in Redis, so a running producer never resends the same record in the
same moment; Kafka acknowledgements then mark the records published, as for any resend.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import click

from eoguard.cli import render
from eoguard.cli.context import CliContext, CliError, NotFoundError, json_option, message_ids, pass_cli
from eoguard.cli.kafka_options import kafka_config, kafka_options
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox, RecordState
from eoguard.store.outbox_admin import scan_records


def _candidates(cli: CliContext, ids: tuple[str, ...], stuck: bool) -> tuple[list[str], list[dict[str, str]]]:
    """What would be resent, and the named ids that would not (with the reason)."""
    client = cli.client()
    if stuck:
        live = Liveness(client, cli.keys).live()
        now = cli.server_ms()
        found = [r.id for batch in scan_records(client, cli.keys) for r in batch
                 if r.state is RecordState.PENDING
                 and (r.next_resend_at_ms <= now or not live.is_live(r.owner))]
        return sorted(found), []
    box = Outbox(client, cli.keys)
    take: list[str] = []
    skipped: list[dict[str, str]] = []
    for message_id in dict.fromkeys(ids):
        rec = box.get(message_id)
        if rec is None:
            skipped.append({"id": message_id, "reason": "no outbox record (consumed, expired or unknown)"})
        elif rec.state is not RecordState.PENDING:
            skipped.append({"id": message_id, "reason": f"{rec.state.value}: Kafka has it already"})
        else:
            take.append(message_id)
    if skipped and not take and len(skipped) == len(ids) and all(
            s["reason"].startswith("no outbox") for s in skipped):
        raise NotFoundError(f"no outbox record for {', '.join(s['id'] for s in skipped)} "
                            f"under prefix {cli.prefix!r}")
    return take, skipped


@click.command()
@click.argument("ids", nargs=-1, metavar="[ID]...", callback=message_ids)
@click.option("--stuck", is_flag=True,
              help="Every pending record past its resend time or whose owner's lease lapsed.")
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, type=click.FloatRange(1),
              help="Seconds to wait for Kafka's acknowledgements.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="List what would be resent, resend nothing.")
@kafka_options
@json_option
@pass_cli
def resend(cli: CliContext, ids: tuple[str, ...], *, stuck: bool, timeout_s: float, yes: bool,
           dry_run: bool, bootstrap_servers: str | None, config_file: Path | None,
           overrides: tuple[str, ...]) -> None:
    """Resend stuck outbox records (or the named ones) through the producer's recovery.

    Named ids are resent whoever owns them (an operator's decision); published, consumed and
    expired records never are. A duplicate this creates is dropped by each consumer scope.
    Kafka's client settings: -b, -F FILE and -X key=value, as kcat takes them.
    """
    conf = kafka_config(bootstrap_servers, config_file, overrides)
    if bool(ids) == stuck:
        raise click.UsageError("give message ids or --stuck (one of the two)")
    take, skipped = _candidates(cli, ids, stuck)
    data: dict[str, Any] = {"dry_run": dry_run, "candidates": take, "skipped": skipped,
                            "claimed": 0, "resent": 0, "unacknowledged": 0}
    if dry_run or not take:
        verb = "would resend" if dry_run else "nothing to resend;"
        render.show(cli, data, f"{verb} {len(take):,} record(s)" + "".join(
            f"\n  skipped {s['id']}: {s['reason']}" for s in skipped))
        return
    if not yes:
        if cli.as_json:
            raise click.UsageError("resend with --json needs --yes (no prompt in script mode)")
        click.confirm(f"resend {len(take):,} outbox record(s) to Kafka?", abort=True, err=True)
    data.update(_run(cli, take if ids else None, conf, timeout_s))
    lines = [f"claimed {data['claimed']:,}, handed {data['resent']:,} to Kafka, "
             f"{data['unacknowledged']:,} not acknowledged within {timeout_s:g} s"]
    lines += [f"  skipped {s['id']}: {s['reason']}" for s in skipped]
    render.show(cli, data, "\n".join(lines))
    if data["unacknowledged"]:
        raise CliError(f"{data['unacknowledged']} resend(s) not acknowledged by Kafka at "
                       f"{conf['bootstrap.servers']}; they stay pending and are "
                       "resent again after resend_after")


def _run(cli: CliContext, ids: list[str] | None, conf: dict[str, str], timeout_s: float
         ) -> dict[str, int]:
    from eoguard.config import ProducerConfig, RedisConfig  # noqa: PLC0415
    from eoguard.producer.guarded import GuardedProducer  # noqa: PLC0415

    config = ProducerConfig(
        kafka={**conf, "message.timeout.ms": int(timeout_s * 1000)},
        redis=RedisConfig(url=cli.redis_url), keyspace=cli.keys, recover_on_start=False,
        recover_interval_s=86_400.0, instance_id=f"eoguard-cli@{socket.gethostname()}:{os.getpid()}")
    producer = GuardedProducer(config)
    try:
        report = producer.resend(ids) if ids is not None else producer.recover()
        outstanding = producer.flush(timeout_s)
    finally:
        producer.close(timeout_s=5.0)
    return {"claimed": report.claimed, "resent": report.resent, "unacknowledged": outstanding,
            "expired": report.expired, "swept": report.swept}
