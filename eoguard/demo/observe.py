"""Reading what a demo run did: ledgers, handled counts in Redis, dead letters, lag, Spark."""

from __future__ import annotations

import functools
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import redis

from eoguard.demo.plan import HANDLED, LATE
from eoguard.store.keys import KeySpace


@dataclass
class LedgerView:
    """A producer worker's ledger, read incrementally while the worker runs."""

    path: Path
    sent: dict[str, int] = field(default_factory=dict)  # id -> order seq
    guaranteed: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    duplicated: set[str] = field(default_factory=set)
    expires_ms: dict[str, int] = field(default_factory=dict)  # id -> expires_at_ms
    refused: dict[str, int] = field(default_factory=dict)  # error name -> sends refused
    max_seq: int = -1
    _offset: int = 0

    @property
    def sent_ids(self) -> set[str]:
        """Every id sent. A send's "S" line follows ``send()``'s return, and a persist-first
        message can be guaranteed (or fail) before that, its line written by a callback: a
        SIGKILL in between leaves a sent message with only that line."""
        return self.sent.keys() | self.guaranteed | self.failed.keys()

    @property
    def next_seq(self) -> int:
        """The order after the last one sent (sends are one at a time: at most the last one
        lacks its "S" line)."""
        return self.max_seq + 1 + (1 if len(self.sent_ids) > len(self.sent) else 0)

    def poll(self) -> LedgerView:
        """Read the complete lines appended since the last poll."""
        if not self.path.exists():
            return self
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].decode().splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "S":
                seq, _, message_id = rest.partition(" ")
                self.sent[message_id] = int(seq)
                self.max_seq = max(self.max_seq, int(seq))
            elif kind == "G":
                self.guaranteed.add(rest)
            elif kind == "F":
                message_id, _, reason = rest.partition(" ")
                self.failed[message_id] = reason
            elif kind == "D":
                self.duplicated.add(rest)
            elif kind == "X":
                message_id, _, expires = rest.partition(" ")
                self.expires_ms[message_id] = int(expires)
            elif kind == "R":
                error = rest.partition(" ")[2]
                self.refused[error] = self.refused.get(error, 0) + 1
        return self


def read_stats(path: Path) -> dict[str, Any] | None:
    """A worker's last stats dump, or None if it never wrote one."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


@functools.cache
def effect_keys(keys: KeySpace, scope: str, name: str) -> tuple[str, ...]:
    """The effect key ``name`` of every shard of ``scope`` (no SCAN: a shared Redis may hold
    millions of other keys). KeySpace spells them from a message id, so probe ids until
    every shard is covered."""
    found: dict[int, str] = {}
    probe = 0
    while len(found) < keys.shards:
        message_id = f"probe-{probe}"
        found.setdefault(keys.shard_of(message_id), keys.effect(scope, message_id, name))
        probe += 1
    return tuple(found[s] for s in sorted(found))


def effect_counts(client: redis.Redis, keys: KeySpace, scope: str, name: str = HANDLED
                  ) -> dict[str, int]:
    """The demo handler's per-message counts in one scope, summed over the shards' hashes."""
    pipe = client.pipeline(transaction=False)
    for key in effect_keys(keys, scope, name):
        pipe.hgetall(key)
    counts: dict[str, int] = {}
    for shard in pipe.execute():
        for message_id, n in shard.items():
            counts[message_id.decode()] = counts.get(message_id.decode(), 0) + int(n)
    return counts


def late_count(client: redis.Redis, keys: KeySpace, scope: str) -> int:
    """Handlings that ran after the message's expires_at (the handler records them)."""
    return sum(effect_counts(client, keys, scope, LATE).values())


def handled_total(client: redis.Redis, keys: KeySpace, scope: str) -> int:
    """How many distinct messages the scope handled (cheap: HLEN per shard hash)."""
    pipe = client.pipeline(transaction=False)
    for key in effect_keys(keys, scope, HANDLED):
        pipe.hlen(key)
    return sum(int(n) for n in pipe.execute())


def _partitions(client: Any, topic: str) -> list[int]:
    meta = client.list_topics(topic, timeout=10)
    return sorted(meta.topics[topic].partitions) if topic in meta.topics else []


def consumer_lag(bootstrap: str, group: str, topic: str) -> int:
    """Records of ``topic`` not yet committed by ``group`` (the whole topic if none)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": False})
    try:
        parts = [confluent_kafka.TopicPartition(topic, p) for p in _partitions(c, topic)]
        lag = 0
        for tp in c.committed(parts, timeout=10):
            low, high = c.get_watermark_offsets(tp, timeout=10)
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return lag
    finally:
        c.close()


def dead_letters(bootstrap: str, dead_letter_topic: str, source_topic: str
                 ) -> dict[tuple[int, int], str]:
    """Source position -> reason kind of every dead letter of ``source_topic``."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                                  "group.id": f"eoguard-demo-reader-{uuid.uuid4().hex[:8]}"})
    out: dict[tuple[int, int], str] = {}
    try:
        ends = {}
        for p in _partitions(c, dead_letter_topic):
            low, high = c.get_watermark_offsets(
                confluent_kafka.TopicPartition(dead_letter_topic, p), timeout=10)
            if high > low:
                ends[p] = high
        if not ends:
            return out
        c.assign([confluent_kafka.TopicPartition(dead_letter_topic, p, confluent_kafka.OFFSET_BEGINNING)
                  for p in ends])
        remaining = dict(ends)
        while remaining:
            msg = c.poll(5.0)
            if msg is None:
                break
            if msg.error():
                continue
            raw_headers: list[Any] = list(msg.headers() or [])
            headers = {str(h[0]): h[1].decode("utf-8", "replace") if isinstance(h[1], bytes)
                       else str(h[1] or "") for h in raw_headers}
            if headers.get("eoguard.source.topic") == source_topic:
                position = (int(headers["eoguard.source.partition"]),
                            int(headers["eoguard.source.offset"]))
                out[position] = headers.get("eoguard.error.kind", "?")
            if (msg.offset() or 0) + 1 >= remaining.get(msg.partition() or 0, 0):
                remaining.pop(msg.partition() or 0, None)
        return out
    finally:
        c.close()


def spark_output(path: Path) -> Counter[str]:
    """Rows per message id in the Spark job's Parquet output (pyarrow, no JVM)."""
    import pyarrow.dataset as ds  # noqa: PLC0415 - only with --spark

    if not path.exists():
        return Counter()
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(columns=["id"])
    return Counter(str(v) for v in table.column("id").to_pylist())


def spark_batch_counts(log: Path) -> tuple[int | None, int | None, int | None]:
    """Duplicates, expired and malformed rows from the job's per-batch JSON lines."""
    totals: dict[str, int] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return None, None, None
    for line in lines:
        if line.startswith('{"batch"'):
            for status, count in json.loads(line)["batch"].get("rows", {}).items():
                totals[status] = totals.get(status, 0) + int(count)
    return totals.get("duplicate", 0), totals.get("expired", 0), totals.get("malformed", 0)
