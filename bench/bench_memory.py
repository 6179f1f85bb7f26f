"""Redis memory per outbox record, per claim key and per batch record, for sizing a Redis.

    python -m bench.bench_memory [--redis-url URL] [--records 100000] [--payloads 200,1024]

A benchmark, not a test. Figures come from the growth of ``INFO memory`` ``used_memory`` (what
the allocator handed Redis: key, value, expiry and dict entries, index entries, allocator
rounding; not the client or AOF buffers) over ``--records`` keys, not from MEMORY USAGE of
one key, which leaves out the keyspace's own dicts and the expiry table; a sample's MEMORY
USAGE is printed beside it.

  outbox record   GuardedProducer's write: the encoded Kafka record (an envelope with a
                  payload of each ``--payloads`` size, topic ``orders``, a 13-byte key) kept
                  until consumed, plus its entry in the shard's resend index
  claim key       a consumer's claim, as left after its batch's done mark (``c|token|position``
                  with a group and topic of realistic length), until expires_at + grace
  batch record    one per (claim pass, shard): ``d|<done_at>`` once done

Claim keys and batch records are measured together, in batches of two sizes (500 ids over
``--records`` and 5 ids over a quarter of them: about 16 and 4.4 batch records per batch):
two equations give both figures. Without
``--redis-url`` it starts a private Redis like the stack's (AOF, ``appendfsync always``,
``noeviction``) under ``/tmp/memredis`` on port 26800 and stops it at the end;
given a URL it uses that Redis and deletes only its own keys (a single node: used_memory of
one server).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from eoguard.codec import EnvelopeCodec
from eoguard.envelope import Envelope, new_message_id, now_ms
from eoguard.modes import KeepUntil
from eoguard.stack.redis_server import RedisServer
from eoguard.store.dedup import DedupStore, position
from eoguard.store.keys import KeySpace
from eoguard.store.outbox import Outbox
from eoguard.store.outbox_types import OutboxRecord

CHUNK = 1_000  # records per outbox write (a producer's batches are of this order)
GROUP, TOPIC = "orders-billing", "orders"


def used_memory(client: redis.Redis[bytes]) -> int:
    """``used_memory`` without the client buffers and the AOF buffer (a big script call's
    query buffer lingers a while), once lazy frees have settled."""
    time.sleep(0.5)
    mem = client.info("memory")
    return int(mem["used_memory"]) - int(mem["mem_clients_normal"]) - int(mem["mem_aof_buffer"])


def drop(client: redis.Redis[bytes], keys: KeySpace) -> None:
    """Delete every key under ``keys``'s prefix (SCAN, UNLINK in chunks)."""
    names = list(client.scan_iter(match=keys.pattern(), count=10_000))
    for start in range(0, len(names), 5_000):
        client.unlink(*names[start:start + 5_000])


def grown(client: redis.Redis[bytes], write: Callable[[], None]) -> int:
    """Bytes ``used_memory`` grew by while ``write`` ran."""
    before = used_memory(client)
    write()
    after = used_memory(client)
    return after - before


def sampled_usage(client: redis.Redis[bytes], pattern: str, sample: int = 200) -> float:
    """Mean MEMORY USAGE of up to ``sample`` keys matching ``pattern``."""
    names = []
    for name in client.scan_iter(match=pattern, count=1_000):
        names.append(name)
        if len(names) >= sample:
            break
    sizes = [int(client.memory_usage(n, samples=0) or 0) for n in names]
    return sum(sizes) / max(1, len(sizes))


def outbox_record_bytes(client: redis.Redis[bytes], records: int, payload: int) -> tuple[float, float]:
    """(used_memory growth per record, MEMORY USAGE of a record) for ``payload``-byte payloads."""
    keys = KeySpace(prefix=f"benchm{uuid.uuid4().hex[:6]}")
    outbox = Outbox(client, keys)
    codec = EnvelopeCodec()
    owner = f"orders-api-{secrets.token_hex(4)}-4242"

    def write() -> None:
        for start in range(0, records, CHUNK):
            batch = []
            for i in range(start, min(records, start + CHUNK)):
                created = now_ms()
                env = Envelope(id=new_message_id(), expires_at_ms=created + 3_600_000,
                               created_at_ms=created, producer=owner, attempt=1,
                               payload_schema=None, payload=secrets.token_bytes(payload),
                               headers={})
                batch.append(OutboxRecord(id=env.id, topic=TOPIC, key=b"customer-%04d" % (i % 997),
                                          value=codec.encode(env), created_at_ms=created,
                                          expires_at_ms=env.expires_at_ms))
            outbox.put(batch, owner=owner, keep_until=KeepUntil.CONSUMED,
                       resend_after_ms=600_000)

    try:
        per = grown(client, write) / records
        usage = sampled_usage(client, keys.outbox_record_pattern())
    finally:
        drop(client, keys)
    return per, usage


def claims_grown(client: redis.Redis[bytes], records: int, batch: int
                 ) -> tuple[int, int, int, tuple[float, float]]:
    """Claim and mark done ``records`` ids in batches of ``batch``: (used_memory growth,
    claim keys, batch records, MEMORY USAGE of a claim key and of a batch record)."""
    keys = KeySpace(prefix=f"benchm{uuid.uuid4().hex[:6]}")
    store = DedupStore(client, scope="billing", keys=keys)
    expires = now_ms() + 3_600_000

    def write() -> None:
        for start in range(0, records, batch):
            token = store.new_token()
            claims = [store.new_claim(new_message_id(), position(GROUP, TOPIC, i % 12, 10_000_000 + i),
                                      expires) for i in range(start, min(records, start + batch))]
            store.claim(token, claims)
            store.done(token, claims)

    try:
        growth = grown(client, write)
        claim_keys = sum(1 for _ in client.scan_iter(match=keys.dedup_pattern(), count=10_000))
        batch_records = sum(1 for _ in client.scan_iter(match=keys.dedup_batch_pattern(),
                                                        count=10_000))
        usage = (sampled_usage(client, keys.dedup_pattern()),
                 sampled_usage(client, keys.dedup_batch_pattern()))
    finally:
        drop(client, keys)
    return growth, claim_keys, batch_records, usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="default: a private Redis on port 26800")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--payloads", default="200,1024", help="payload sizes in bytes")
    args = parser.parse_args()
    server = None
    url = args.redis_url
    if url is None:
        workdir = Path("/tmp/memredis")
        shutil.rmtree(workdir, ignore_errors=True)
        server = RedisServer(workdir, port=26800)
        server.start()
        url = server.address
    client = redis.Redis.from_url(url)
    try:
        info = client.info("server")
        print(f"Redis {info['redis_version']} ({client.info('memory')['mem_allocator']}), "
              f"{args.records} keys per figure; bytes from used_memory growth "
              f"(MEMORY USAGE of one key in brackets)")
        for payload in (int(p) for p in args.payloads.split(",")):
            per, usage = outbox_record_bytes(client, args.records, payload)
            print(f"  outbox record, {payload:5d} B payload   {per:7.0f} B   [{usage:.0f} B]")
        big = claims_grown(client, args.records, 500)
        small = claims_grown(client, args.records // 4, 5)
        # growth = claim_keys * c + batch_records * b, for both runs: solve for c and b.
        (g1, k1, r1, usage), (g2, k2, r2, _) = big, small
        det = k1 * r2 - k2 * r1
        per_claim = (g1 * r2 - g2 * r1) / det
        per_batch = (k1 * g2 - k2 * g1) / det
        print(f"  claim key (done)                {per_claim:7.0f} B   [{usage[0]:.0f} B]")
        print(f"  batch record (done)             {per_batch:7.0f} B   [{usage[1]:.0f} B]")
        print(f"  (batches of 500: {k1} claim keys, {r1} batch records, {g1 / k1:.0f} B per "
              f"claim all in; batches of 5: {k2} claim keys, {r2} batch records, "
              f"{g2 / k2:.0f} B per claim all in)")
    finally:
        client.close()
        if server is not None:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
