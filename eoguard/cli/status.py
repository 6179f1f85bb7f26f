"""``eoguard status``: outbox, dedup keys, liveness leases and memory, from one SCAN pass."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import click

from eoguard.cli import render
from eoguard.cli.context import CliContext, json_option, pass_cli
from eoguard.redaction import redact_url
from eoguard.store.dedup import BatchRecord, BatchState, DedupEntry, IdState
from eoguard.store.dedup_admin import read_entries
from eoguard.store.keys import KeySpace
from eoguard.store.layout import recorded_layout
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import RecordState
from eoguard.store.outbox_admin import RecordSummary, read_records
from eoguard.store.scan import scan_pages

HELP = """Overall state: outbox records by topic and state (pending / published), the oldest
pending record's age, records past their resend time; per dedup scope, claim keys by their id's
state (done / in progress / free to take over / partial) and batch records (open with lease
left / open with lease lapsed / done); dedup keys of layout version 1 still under the prefix,
when there are any; live producers and consumers (liveness leases); memory used by these keys.

How: one SCAN pass over the key prefix (COUNT --count per call, never KEYS) with a pipelined
read per batch, so the figures are exact and Redis stays responsive; a progress bar shows the
pass on a terminal. SCAN visits every key of the database (the prefix filter applies after),
about a second per million keys; the reads cost in proportion to eoguard's own keys.

Why not counters: outbox records and dedup keys disappear by TTL, which Redis does silently
(no script runs), so counters kept by the scripts would drift up forever and count records
that expired long ago.
"""


@dataclass
class OutboxTally:
    """Outbox figures accumulated over the SCAN."""

    by_topic_state: Counter[tuple[str, str]] = field(default_factory=Counter)
    oldest_pending_created_ms: int | None = None
    past_resend: int = 0
    max_attempt: int = 0
    memory_bytes: int = 0

    def add(self, rec: RecordSummary, now_ms: int) -> None:
        self.by_topic_state[(rec.topic, rec.state.value)] += 1
        self.max_attempt = max(self.max_attempt, rec.attempt)
        if rec.state is RecordState.PENDING:
            if self.oldest_pending_created_ms is None or rec.created_at_ms < self.oldest_pending_created_ms:
                self.oldest_pending_created_ms = rec.created_at_ms
            if rec.next_resend_at_ms <= now_ms:
                self.past_resend += 1


CLAIM_STATES = (IdState.DONE, IdState.IN_PROGRESS, IdState.FREE, IdState.PARTIAL)
"""The states a claim key's id can be in (NEW has no key), in the order the CLI shows them."""
BATCH_STATES = ("open", "lapsed", "done")
"""A batch record: open with lease left, open with its lease lapsed, or done."""


@dataclass
class DedupTally:
    """Dedup figures accumulated over the SCAN: claim keys by id state, batch records by
    state, per scope; dedup keys of layout version 1 under the prefix."""

    claims: Counter[tuple[str, IdState]] = field(default_factory=Counter)
    batches: Counter[tuple[str, str]] = field(default_factory=Counter)
    legacy_keys: int = 0
    memory_bytes: int = 0

    def add(self, entry: DedupEntry, now_ms: int) -> None:
        self.claims[(entry.scope, entry.id_state(now_ms))] += 1

    def add_batch(self, record: BatchRecord, now_ms: int) -> None:
        self.batches[(KeySpace.scope_of(record.key), batch_state(record, now_ms))] += 1

    def by_scope(self) -> dict[str, dict[str, dict[str, int]]]:
        scopes = sorted({s for s, _ in self.claims} | {s for s, _ in self.batches})
        return {scope: {
            "claims": {state.value: self.claims[(scope, state)] for state in CLAIM_STATES},
            "batches": {state: self.batches[(scope, state)] for state in BATCH_STATES},
        } for scope in scopes}


def batch_state(record: BatchRecord, now_ms: int) -> str:
    """One of :data:`BATCH_STATES`, judged at ``now_ms`` on Redis's clock."""
    if record.state is BatchState.DONE:
        return "done"
    return "open" if record.at_ms > now_ms else "lapsed"


def read_batches(cli: CliContext, names: Sequence[str]) -> list[BatchRecord]:
    """The batch records ``names`` (GET and PEXPIRETIME, pipelined); vanished ones left out."""
    if not names:
        return []
    pipe: Any = cli.client().pipeline(transaction=False)
    for name in names:
        pipe.get(name)
        pipe.execute_command("PEXPIRETIME", name)
    replies = pipe.execute()
    return [BatchRecord.parse(name, value.decode(), int(expire_at))
            for name, value, expire_at in zip(names, replies[::2], replies[1::2], strict=True)
            if value is not None]


def _memory(cli: CliContext, redis_keys: Sequence[str]) -> dict[str, int]:
    """Bytes Redis uses per key (MEMORY USAGE, pipelined; a vanished key counts 0)."""
    if not redis_keys:
        return {}
    pipe = cli.client().pipeline(transaction=False)
    for key in redis_keys:
        pipe.memory_usage(key, samples=0)
    return {key: int(n or 0) for key, n in zip(redis_keys, pipe.execute(), strict=True)}


@dataclass
class ScanBatch:
    """One SCAN call's names under the prefix, sorted by what they are."""

    names: list[str]
    records: list[str]  # outbox records
    claims: list[str]  # claim keys
    batches: list[str]  # batch records
    legacy: int  # dedup keys of layout version 1


def scan_prefix(cli: CliContext, count: int) -> Iterator[ScanBatch]:
    """One SCAN pass over the prefix, a :class:`ScanBatch` per call."""
    client, keys = cli.client(), cli.keys
    patterns = (keys.outbox_record_pattern(), keys.dedup_pattern(), keys.dedup_batch_pattern(),
                keys.legacy_dedup_pattern())
    for names in scan_pages(client, keys.pattern(), count=count, doing="scanning the prefix"):
        text = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        records, claims, batches, legacy = ([n for n in text if fnmatchcase(n, p)] for p in patterns)
        yield ScanBatch(text, records, claims, batches, len(legacy))


def collect(cli: CliContext, *, scope: str | None, count: int, memory: bool) -> dict[str, Any]:
    """Scan the key space once and return the status as plain data."""
    client = cli.client()
    keys = cli.keys
    now = cli.server_ms()
    outbox, dedup = OutboxTally(), DedupTally()
    all_keys = total_bytes = 0
    with render.progress(cli) as progress:
        task = progress.add_task("scanning", total=max(int(client.dbsize()), 1))
        for found in scan_prefix(cli, count):
            all_keys += len(found.names)
            progress.advance(task, count)
            records = read_records(client, found.records)
            entries = [e for e in read_entries(client, keys, found.claims)
                       if scope is None or e.scope == scope]
            batches = [b for b in read_batches(cli, found.batches)
                       if scope is None or KeySpace.scope_of(b.key) == scope]
            for rec in records:
                outbox.add(rec, now)
            for entry in entries:
                dedup.add(entry, now)
            for batch in batches:
                dedup.add_batch(batch, now)
            dedup.legacy_keys += found.legacy
            if memory:
                used = _memory(cli, found.names)
                total_bytes += sum(used.values())
                outbox.memory_bytes += sum(used.get(r.redis_key, 0) for r in records)
                dedup.memory_bytes += sum(used.get(e.key, 0) for e in entries)
                dedup.memory_bytes += sum(used.get(b.key, 0) for b in batches)
    layout = recorded_layout(client, keys.prefix)
    live = Liveness(client, keys).live()
    consumers = Liveness(client, keys, role="consumers").live()
    topics: dict[str, dict[str, int]] = defaultdict(lambda: {"pending": 0, "published": 0})
    for (topic, state), n in sorted(outbox.by_topic_state.items()):
        topics[topic][state] = n
    oldest = outbox.oldest_pending_created_ms
    return {
        "redis_url": None, "prefix": keys.prefix, "shards": keys.shards, "server_time_ms": now,
        "layout": None if layout is None else {  # as recorded by the first process (None: no use yet)
            "version": layout.version, "shards": layout.shards, "max_ttl_ms": layout.max_ttl_ms},
        "outbox": {
            "records": sum(outbox.by_topic_state.values()),
            "pending": sum(n for (_, s), n in outbox.by_topic_state.items() if s == "pending"),
            "published": sum(n for (_, s), n in outbox.by_topic_state.items() if s == "published"),
            "by_topic": dict(topics),
            "oldest_pending_age_ms": None if oldest is None else max(0, now - oldest),
            "past_resend_time": outbox.past_resend,
            "max_attempt": outbox.max_attempt,
            "memory_bytes": outbox.memory_bytes if memory else None,
        },
        "dedup": {
            "claim_keys": sum(dedup.claims.values()),
            "claims": {state.value: sum(n for (_, s), n in dedup.claims.items() if s is state)
                       for state in CLAIM_STATES},
            "batch_records": sum(dedup.batches.values()),
            "batches": {state: sum(n for (_, s), n in dedup.batches.items() if s == state)
                        for state in BATCH_STATES},
            "by_scope": dedup.by_scope(),
            "v1_keys": dedup.legacy_keys,  # dedup keys of layout version 1, whatever the scope
            "memory_bytes": dedup.memory_bytes if memory else None,
        },
        "live": {
            "producers": {k: v - live.read_at_ms for k, v in sorted(live.deadlines.items())},
            "consumers": {k: v - consumers.read_at_ms for k, v in sorted(consumers.deadlines.items())},
        },
        "keys": all_keys,  # every key under the prefix: records, indexes, dedup, effects, leases
        "memory_bytes": total_bytes if memory else None,
    }


def _slashed(counts: dict[str, int]) -> str:
    return " / ".join(f"{n:,}" for n in counts.values())


def _tables(data: dict[str, Any]) -> list[Any]:
    ob, dd, live = data["outbox"], data["dedup"], data["live"]
    layout = data["layout"]
    summary = render.key_values(f"eoguard status - prefix {data['prefix']!r}", {
        "layout": "not recorded (no producer or consumer started)" if layout is None else
        f"version {layout['version']}, {layout['shards']} shards, max ttl "
        f"{render.duration_ms(layout['max_ttl_ms']) or '-'}",
        "outbox records": ob["records"],
        "  pending / published": f"{ob['pending']:,} / {ob['published']:,}",
        "  oldest pending age": render.duration_ms(ob["oldest_pending_age_ms"]),
        "  past resend time": ob["past_resend_time"],
        "  highest attempt": ob["max_attempt"] or None,
        "claim keys": dd["claim_keys"],
        "  done / in progress / free / partial": _slashed(dd["claims"]),
        "batch records": dd["batch_records"],
        "  open / lease lapsed / done": _slashed(dd["batches"]),
        **({"v1 dedup keys left": dd["v1_keys"]} if dd["v1_keys"] else {}),
        "live producers": len(live["producers"]),
        "live consumers": len(live["consumers"]),
        "keys under the prefix": data["keys"],
        "memory of those keys": None if data["memory_bytes"] is None
        else f"{data['memory_bytes'] / 1024:,.1f} KiB",
    })
    out: list[Any] = [summary]
    if ob["by_topic"]:
        out.append(render.table("outbox by topic", ["topic", "pending", "published"],
                                [[t, v["pending"], v["published"]] for t, v in ob["by_topic"].items()]))
    if dd["by_scope"]:
        out.append(render.table(
            "dedup by scope: claim keys by id state, batch records",
            ["scope", "done", "in progress", "free", "partial",
             "batches open", "lease lapsed", "batches done"],
            [[s, *v["claims"].values(), *v["batches"].values()] for s, v in dd["by_scope"].items()]))
    leases = [["producer", k, render.duration_ms(v)] for k, v in live["producers"].items()]
    leases += [["consumer", k, render.duration_ms(v)] for k, v in live["consumers"].items()]
    if leases:
        out.append(render.table("liveness leases", ["role", "instance", "lease left"], leases))
    return out


@click.command(help=HELP)
@click.option("--scope", default=None, help="Only the dedup keys of this consumer scope.")
@click.option("--count", default=1000, show_default=True, type=click.IntRange(10, 100_000),
              help="SCAN COUNT: keys Redis visits per call (larger: fewer round trips, longer calls).")
@click.option("--memory/--no-memory", default=True, show_default=True,
              help="Sum MEMORY USAGE of the keys scanned (one more pipelined call per batch).")
@json_option
@pass_cli
def status(cli: CliContext, *, scope: str | None, count: int, memory: bool) -> None:
    data = collect(cli, scope=scope, count=count, memory=memory)
    data["redis_url"] = redact_url(cli.redis_url)
    render.show(cli, data, *_tables(data))
