"""``eoguard outbox list|show|resend|purge``: the producers' Redis outbox, read and repaired."""

from __future__ import annotations

import base64
from typing import Any

import click

from eoguard.cli import render
from eoguard.cli.context import DURATION, CliContext, NotFoundError, json_option, message_ids, pass_cli
from eoguard.cli.resend import resend
from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.codec.headers import read_headers
from eoguard.codec.registry_payloads import unframe
from eoguard.errors import CodecError
from eoguard.store.liveness import Liveness, LiveSet
from eoguard.store.outbox import Outbox, RecordState
from eoguard.store.outbox_admin import RecordSummary, scan_records, sweep_index


@click.group()
def outbox() -> None:
    """The outbox: one record per message not yet known to be consumed, TTL = expires_at.

    A record is pending (written by a producer, not yet acknowledged by Kafka) or published
    (acknowledged, kept until the consumer scope's end-to-end ack). Stuck = pending and either
    past its resend time or owned by a producer whose liveness lease lapsed.
    """


outbox.add_command(resend)


def is_stuck(rec: RecordSummary, live: LiveSet, now_ms: int) -> bool:
    """Pending and due for resend, or its owner is gone (the rule recovery applies)."""
    return rec.state is RecordState.PENDING and (
        rec.next_resend_at_ms <= now_ms or not live.is_live(rec.owner))


def summary_row(rec: RecordSummary, live: LiveSet, now_ms: int) -> dict[str, Any]:
    return {
        "id": rec.id, "topic": rec.topic, "state": rec.state.value, "owner": rec.owner,
        "owner_live": live.is_live(rec.owner), "attempt": rec.attempt,
        "created_at": render.iso_ms(rec.created_at_ms), "age_ms": now_ms - rec.created_at_ms,
        "expires_at": render.iso_ms(rec.expires_at_ms), "ttl_left_ms": rec.expires_at_ms - now_ms,
        "next_resend_in_ms": (rec.next_resend_at_ms - now_ms
                              if rec.state is RecordState.PENDING else None),
        "stuck": is_stuck(rec, live, now_ms),
    }


@outbox.command("list")
@click.option("--topic", multiple=True, help="Only records for this topic (repeatable).")
@click.option("--state", type=click.Choice([s.value for s in RecordState]), default=None,
              help="Only records in this state.")
@click.option("--older-than", type=DURATION, default=None, metavar="DURATION",
              help="Only records created longer ago than this (e.g. 30s, 5m, 2h).")
@click.option("--stuck", is_flag=True, help="Only stuck records (what `resend --stuck` would take).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(0),
              help="Show at most this many (oldest first); 0 = all. The total is always counted.")
@json_option
@pass_cli
def list_records(cli: CliContext, *, topic: tuple[str, ...], state: str | None, older_than: int | None,
                 stuck: bool, limit: int) -> None:
    """List outbox records (one SCAN pass, oldest first) with filters."""
    client = cli.client()
    now = cli.server_ms()
    live = Liveness(client, cli.keys).live()
    matched: list[RecordSummary] = []
    with render.progress(cli) as progress:
        task = progress.add_task("scanning outbox", total=max(int(client.dbsize()), 1))
        for batch in scan_records(client, cli.keys):
            progress.advance(task, 1000)
            matched += [r for r in batch
                        if (not topic or r.topic in topic)
                        and (state is None or r.state.value == state)
                        and (older_than is None or now - r.created_at_ms >= older_than)
                        and (not stuck or is_stuck(r, live, now))]
    matched.sort(key=lambda r: (r.created_at_ms, r.id))
    shown = matched[:limit] if limit else matched
    rows = [summary_row(r, live, now) for r in shown]
    data = {"matched": len(matched), "shown": len(rows), "records": rows}
    title = f"outbox records: {len(matched):,} matched" + (
        f", oldest {len(rows):,} shown" if len(rows) < len(matched) else "")
    render.show(cli, data, render.table(
        title, ["id", "topic", "state", "attempt", "age", "ttl left", "next resend", "owner", "stuck"],
        [[r["id"], r["topic"], r["state"], r["attempt"], render.duration_ms(r["age_ms"]),
          render.duration_ms(r["ttl_left_ms"]), render.duration_ms(r["next_resend_in_ms"]),
          r["owner"] + ("" if r["owner_live"] else " (gone)"), r["stuck"]] for r in rows]))


def _payload_json(value: Any) -> Any:
    """A decoded payload as JSON-able data (bytes as base64, the rest by str)."""
    if isinstance(value, dict):
        return {k: _payload_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_payload_json(v) for v in value]
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _decoded(value: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], Any]:
    """A record's fields and payload as ``outbox show`` shows them; CodecError when they do
    not decode. A record in the header wire format (docs/design.md §3) has its fields in its
    headers; its registry-framed payload is shown as its schema id (no registry here)."""
    fields = read_headers(headers)
    if fields is not None:
        return ({"wire_format": "headers", "id": fields.id, "producer": fields.producer,
                 "attempt": fields.attempt, "created_at": render.iso_ms(fields.created_at_ms),
                 "expires_at": render.iso_ms(fields.expires_at_ms),
                 "payload_bytes": len(value), "headers": fields.app},
                {"schema_id": unframe(value)[0]} if fields.avro else _payload_json(value))
    env = EnvelopeCodec().decode(value)
    return ({"id": env.id, "producer": env.producer, "attempt": env.attempt,
             "created_at": render.iso_ms(env.created_at_ms),
             "expires_at": render.iso_ms(env.expires_at_ms),
             "payload_schema": env.payload_schema,
             "payload_writer": (env.payload_fingerprint.hex()
                                if env.payload_fingerprint else None),
             "payload_bytes": len(env.payload), "headers": env.headers},
            _payload_json(PayloadCodec().decode_envelope(env)))


@outbox.command()
@click.argument("message_id", callback=message_ids)
@json_option
@pass_cli
def show(cli: CliContext, message_id: str) -> None:
    """One record decoded: envelope fields, the payload with its schema, TTL left."""
    client = cli.client()
    box = Outbox(client, cli.keys)
    rec = box.get(message_id)
    if rec is None:
        raise NotFoundError(f"no outbox record for id {message_id} under prefix {cli.prefix!r} "
                            "(never written, already consumed, or expired)")
    now = cli.server_ms()
    expire_at = box.expire_times([message_id])[message_id]
    live = Liveness(client, cli.keys).live()
    record: dict[str, Any] = {
        "id": rec.id, "topic": rec.topic,
        "key": None if rec.key is None else rec.key.decode("utf-8", "replace"),
        "state": rec.state.value, "owner": rec.owner, "owner_live": live.is_live(rec.owner),
        "attempt": rec.attempt, "keep_until": rec.keep_until.value,
        "created_at": render.iso_ms(rec.created_at_ms), "expires_at": render.iso_ms(rec.expires_at_ms),
        "ttl_left_ms": expire_at - now if expire_at >= 0 else None,
        "next_resend_at": render.iso_ms(rec.next_resend_at_ms) if rec.state is RecordState.PENDING else None,
        "kafka_headers": rec.headers,
        "value_bytes": len(rec.value),
    }
    envelope: dict[str, Any] | None = None
    payload: Any = None
    error: str | None = None
    try:
        envelope, payload = _decoded(rec.value, rec.headers)
    except CodecError as exc:
        error = f"{type(exc).__name__}: {exc}"
    data = {"record": record, "envelope": envelope, "payload": payload, "decode_error": error}
    parts: list[Any] = [render.key_values(f"outbox record {rec.id}", {
        **{k: v for k, v in record.items() if k not in ("ttl_left_ms", "kafka_headers")},
        "ttl left": render.duration_ms(record["ttl_left_ms"]),
        "kafka headers": record["kafka_headers"] or None})]
    if envelope is not None:
        parts.append(render.key_values("envelope", envelope))
        framed = isinstance(payload, dict) and "schema_id" in payload
        kind = envelope.get("payload_schema") or ("registry-framed Avro" if framed
                                                  else "raw bytes")
        parts.append(render.key_values(f"payload ({kind})",
                                       payload if isinstance(payload, dict) else {"value": payload}))
    if error:
        parts.append(f"[red]value does not decode:[/red] {error}")
    render.show(cli, data, *parts)


@outbox.command()
@click.option("--expired", is_flag=True, required=True,
              help="Remove resend-index entries whose record expired (required: the only purge).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Count what would be removed, remove nothing.")
@json_option
@pass_cli
def purge(cli: CliContext, *, expired: bool, yes: bool, dry_run: bool) -> None:
    """Purge index entries of expired records (the scavenger's sweep, on demand).

    Records themselves expire by TTL; their entries in the per-shard resend index stay until
    a recovery pass or this purge removes them. Checked and removed atomically per shard, so
    a record written meanwhile keeps its entry.
    """
    client = cli.client()
    stale = sweep_index(client, cli.keys, dry_run=True)
    if not dry_run and stale and not yes and not cli.as_json:
        click.confirm(f"remove {len(stale):,} index entries of expired records?", abort=True, err=True)
    elif not dry_run and stale and not yes:
        raise click.UsageError("purge with --json needs --yes (no prompt in script mode)")
    ids = stale if dry_run or not stale else sweep_index(client, cli.keys, dry_run=False)
    data = {"dry_run": dry_run, "count": len(ids), "ids": ids}
    verb = "would remove" if dry_run else "removed"
    render.show(cli, data, f"{verb} {len(ids):,} index entries of expired records")
