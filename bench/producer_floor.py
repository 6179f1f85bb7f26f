"""The floor of persist-first: the least a hand-written outbox producer costs (bench_producer).

Same guarantee shape as GuardedProducer in persist-first mode: every message is stored in
Redis before it is produced and deleted once Kafka acknowledged it. Messages go to Redis in
batches, one pipelined ``SET key value PXAT expires_at`` per message (its RESP packed by hiredis:
redis-py's Pipeline spends about three times the client CPU per command), on a writer thread
and its own connection while the sending thread encodes the next batches and produces the
stored ones (a batch goes to Kafka once all its replies are in, in send order). Delivery
callbacks collect the keys; the poll thread deletes what each poll collected with one
pipelined ``DEL`` (1,000 keys a command, as eoguard's scripts delete; eoguard deletes with
``DEL`` too).

A floor, not a rival: no index, so nothing could resend a record after a crash (eoguard keeps
one: a ``ZADD`` per record, a ``ZREM`` once published); no script, so expiries follow this
host's clock (eoguard clamps them by Redis's time); no retry when Redis or Kafka fails; no
application callbacks. A failed delivery or Redis reply lands in ``failed`` (the writer
then drops what follows) and fails the benchmark.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
from typing import Any

import hiredis
import redis
from confluent_kafka import Producer

__all__ = ["FloorOutbox"]

_Item = tuple[bytes, bytes, bytes, bytes]  # Redis key, value, expires_at (ms), Kafka key
_DEL_KEYS = 1000  # keys per DEL command
_pack: Any = hiredis.pack_command  # RESP, in C (its stubs want a 1-tuple)


class FloorOutbox:
    """Hand-written persist-first over ``producer`` and ``client``: records under ``prefix``."""

    def __init__(self, producer: Producer, client: redis.Redis, topic: str, prefix: str, *,
                 batch: int, max_waiting: int) -> None:
        self.producer = producer
        self.client = client
        self.topic = topic
        self.prefix = prefix
        self.key_prefix = prefix.encode()
        self.batch_size = batch
        self.batch: list[_Item] = []
        # At most max_waiting messages wait for Redis: send() blocks beyond.
        self.to_write: queue.Queue[list[_Item] | None] = queue.Queue(max(1, max_waiting // batch))
        self.written: queue.Queue[list[_Item] | None] = queue.Queue()
        self.acked: collections.deque[bytes] = collections.deque()
        self.failed: list[object] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._write_loop, name="floor-write", daemon=True),
                        threading.Thread(target=self._poll_loop, name="floor-poll", daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def send(self, message_id: str, value: bytes, expires_at_ms: int, key: bytes) -> None:
        """Queue one message; a full batch goes to the writer, and the batches Redis stored
        meanwhile go to Kafka."""
        self.batch.append((self.key_prefix + message_id.encode(), value, b"%d" % expires_at_ms,
                           key))
        if len(self.batch) >= self.batch_size:
            self.to_write.put(self.batch)
            self.batch = []
            while not self.written.empty():  # None comes only after flush's
                stored = self.written.get_nowait()
                assert stored is not None
                self._produce(stored)

    def flush(self, timeout_s: float) -> int:
        """Store and produce what is left and wait for Kafka; returns how many are not
        delivered. Send nothing after it."""
        if self.batch:
            self.to_write.put(self.batch)
            self.batch = []
        self.to_write.put(None)
        while (stored := self.written.get()) is not None:
            self._produce(stored)
        return int(self.producer.flush(timeout_s))

    def close(self) -> int:
        """Stop the threads and delete the records acknowledged since the last poll; returns
        how many records are left under the prefix (0 unless a delivery failed)."""
        self.stopping.set()
        for thread in self.threads:
            thread.join()
        self._delete_acked()
        return sum(1 for _ in self.client.scan_iter(match=self.prefix + "*", count=10_000))

    def _delivered(self, key: bytes, err: object, _msg: object) -> None:
        if err is None:
            self.acked.append(key)
        else:
            self.failed.append(err)

    def _produce(self, stored: list[_Item]) -> None:
        produce, poll, delivered = self.producer.produce, self.producer.poll, self._delivered
        for key, value, _, kafka_key in stored:
            callback = functools.partial(delivered, key)
            while True:
                try:
                    produce(self.topic, value, kafka_key, on_delivery=callback)
                    break
                except BufferError:
                    poll(0.001)
        poll(0)

    def _write_loop(self) -> None:
        conn = self.client.connection_pool.get_connection()
        try:
            while (batch := self.to_write.get()) is not None:
                conn.send_packed_command([b"".join([  # type: ignore[no-untyped-call]
                    _pack(("SET", key, value, "PXAT", at)) for key, value, at, _ in batch])])
                for _ in batch:
                    conn.read_response()  # OK, or raises the error reply
                self.written.put(batch)
        except redis.RedisError as exc:
            self.failed.append(exc)
            conn.disconnect()  # type: ignore[no-untyped-call]
            while self.to_write.get() is not None:  # dropped: send() never blocks, and the
                pass  # run fails on self.failed once flushed
        finally:
            self.client.connection_pool.release(conn)
            self.written.put(None)

    def _poll_loop(self) -> None:
        while not self.stopping.is_set():
            self.producer.poll(0.05)
            self._delete_acked()

    def _delete_acked(self) -> None:
        acked = self.acked
        keys = [acked.popleft() for _ in range(len(acked))]
        if keys:
            pipe = self.client.pipeline(transaction=False)
            for start in range(0, len(keys), _DEL_KEYS):
                pipe.execute_command("DEL", *keys[start:start + _DEL_KEYS])
            pipe.execute()
