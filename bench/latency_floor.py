"""The floors of bench.bench_latency: eoguard's Redis work per message, in plain commands.

A floor pipeline does what an eoguard pipeline asks of Redis, in as few plain commands as that
takes: no scripts, no reads before writes, no leases, no retries.
The gap between eoguard and its floor in the same round is what eoguard's own machinery costs;
what is left of the gap between the floor and plain is what the Redis writes cost on this
machine.

:class:`FloorConsumer`, the floor of GuardedConsumer, per batch (up to ``batch_size``
records, read as GuardedConsumer reads them: wait for one, then take what is fetched):

  1. decode each envelope with fastavro (as the plain loop does);
  2. claim: ``SET <claim key> <token> NX PXAT <expires_at>`` per record, pipelined (eoguard:
     one claim key written per message), in one round trip with the previous batch's done
     marks (4), its replies awaited: one round trip, one AOF fsync, per batch;
  3. handle each record the claim made ours;
  4. done: ``SET <batch record> done PXAT`` once and one ``DEL`` of every record's outbox key
     (eoguard: the batch record written once per shard, the senders' outbox records deleted
     by id in one ``DEL``), sent with the next batch's claims, or alone when no record came
     within the poll's timeout;
  5. once its done marks landed, commit the batch's offsets, asynchronously (as
     GuardedConsumer does).

The handler waits for one round trip per batch, the least a claim before handling takes.

:class:`FloorSender`, the floor of persist-first's GuardedProducer: messages queue up; a writer
thread takes all that are queued, ``SET <outbox key> <value> PXAT`` each (pipelined with the
``DEL`` of those Kafka acknowledged since), waits for the reply, then produces them; a
delivery report queues its record's ``DEL``.
"""

from __future__ import annotations

import functools
import io
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.bench_producer import PlainEncoder
from eoguard.codec import ENVELOPE_SCHEMA, SchemaRegistry
from eoguard.codec.envelope_codec import HEADER_SIZE

TTL_MS = 600_000  # every message's, as the other pipelines of the benchmark send them


def claim_key(prefix: str, message_id: str) -> str:
    return f"{prefix}:fc:{message_id}"


def outbox_key(prefix: str, message_id: str) -> str:
    return f"{prefix}:fo:{message_id}"


class FloorConsumer:
    """The smallest dedup consumer with GuardedConsumer's Redis work shape (module docstring)."""

    def __init__(self, kafka: dict[str, Any], client: redis.Redis, topic: str, prefix: str,
                 handle: Callable[[bytes], None], batch_size: int = 500) -> None:
        self.schema = fastavro.parse_schema(SchemaRegistry.default().get(ENVELOPE_SCHEMA).schema)
        self.client, self.prefix, self.handle, self.batch_size = client, prefix, handle, batch_size
        self.consumer = Consumer({**kafka, "enable.auto.commit": False})
        self.consumer.subscribe([topic])
        self.pending: tuple[str, int, list[str], list[Message]] | None = None  # done marks

    def poll_once(self, timeout_s: float) -> int:
        """One batch read, claimed and handled (the previous one's done marks and commit
        riding with its claims); returns its number of records."""
        msgs = self.consumer.consume(1, timeout_s)
        if not msgs:
            self.flush()
            return 0
        msgs += self.consumer.consume(self.batch_size - 1, 0.0)
        msgs = [msg for msg in msgs if msg.error() is None]
        envs: list[Any] = [  # each a dict: the envelope's fields
            fastavro.schemaless_reader(io.BytesIO((msg.value() or b"")[HEADER_SIZE:]),
                                       self.schema, None) for msg in msgs]
        token = uuid.uuid4().hex
        ids = [str(env["id"]) for env in envs]
        pxats = [int(env["expires_at"].timestamp() * 1000) for env in envs]
        pipe = self.client.pipeline(transaction=False)
        marked = self._mark_done(pipe)
        for message_id, pxat in zip(ids, pxats, strict=True):
            pipe.set(claim_key(self.prefix, message_id), token, nx=True, pxat=pxat)
        replies = pipe.execute()
        if marked:
            self.commit(marked)
        for env, new in zip(envs, replies[len(replies) - len(envs):], strict=True):
            if new:
                self.handle(env["payload"])
        if envs:
            self.pending = (token, max(pxats), ids, msgs)
        return len(msgs)

    def flush(self) -> None:
        """Send the last batch's done marks alone, then commit it."""
        pipe = self.client.pipeline(transaction=False)
        marked = self._mark_done(pipe)
        if marked:
            pipe.execute()
            self.commit(marked)

    def _mark_done(self, pipe: Any) -> list[Message]:
        """Queue the done marks of the batch handled last on ``pipe``; its records to commit."""
        if self.pending is None:
            return []
        token, pxat, ids, msgs = self.pending
        self.pending = None
        pipe.set(f"{self.prefix}:fb:{token}", "done", pxat=pxat)
        pipe.delete(*(outbox_key(self.prefix, message_id) for message_id in ids))
        return msgs

    def commit(self, msgs: list[Message]) -> None:
        ends: dict[tuple[str, int], int] = {}
        for msg in msgs:
            ends[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
        self.consumer.commit(offsets=[TopicPartition(topic, partition, offset)
                                      for (topic, partition), offset in ends.items()],
                             asynchronous=True)

    def close(self) -> None:
        self.flush()
        self.consumer.close()
        self.client.close()


class FloorSender:
    """persist-first's floor: each message in Redis before it is produced (module docstring).
    ``send`` encodes on the caller's thread and queues; ``close`` flushes and waits."""

    def __init__(self, producer: Producer, client: redis.Redis, topic: str, prefix: str) -> None:
        self.producer, self.client, self.topic, self.prefix = producer, client, topic, prefix
        self.encoder = PlainEncoder("bench-latency")
        self.queued: list[tuple[str, bytes]] = []  # (outbox key, envelope)
        self.delivered: list[str] = []  # outbox keys to delete (the writer thread's only)
        self.wake = threading.Condition()
        self.closing = False
        self.failed: BaseException | None = None
        self.writer = threading.Thread(target=self._write, name="floor-writer", daemon=True)
        self.writer.start()

    def send(self, payload: bytes) -> None:
        message_id = str(uuid.uuid4())
        now = time.time_ns() // 1_000_000
        value = self.encoder.encode_as(message_id, payload, now, now + TTL_MS)
        with self.wake:
            if self.failed is not None:
                raise RuntimeError("the floor's writer failed") from self.failed
            self.queued.append((outbox_key(self.prefix, message_id), value))
            self.wake.notify()

    def close(self) -> None:
        with self.wake:
            self.closing = True
            self.wake.notify()
        self.writer.join(90)
        self.client.close()
        if self.failed is not None:
            raise RuntimeError("the floor's writer failed") from self.failed

    def __enter__(self) -> FloorSender:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _write(self) -> None:
        try:
            while True:
                with self.wake:
                    if not self.queued and not self.closing:
                        self.wake.wait(0.005)  # then serve delivery reports
                    values, self.queued = self.queued, []
                    closing = self.closing
                self.producer.poll(0)
                if values or self.delivered:
                    self._round_trip(values)
                for key, value in values:
                    self.producer.produce(self.topic, value,
                                          on_delivery=functools.partial(self._on_delivery, key))
                self.producer.poll(0)
                if closing and not values:
                    break
            self.producer.flush(60)
            self._round_trip([])
        except BaseException as exc:  # reported to the sending thread
            self.failed = exc

    def _round_trip(self, values: list[tuple[str, bytes]]) -> None:
        """The writes of ``values`` and the deletes of the records delivered since, awaited."""
        pipe = self.client.pipeline(transaction=False)
        pxat = time.time_ns() // 1_000_000 + TTL_MS
        for key, value in values:
            pipe.set(key, value, pxat=pxat)
        if self.delivered:
            pipe.delete(*self.delivered)
            self.delivered = []
        pipe.execute()

    def _on_delivery(self, key: str, err: Any, _msg: Message) -> None:
        if err is None:
            self.delivered.append(key)
