"""Redis CPU per dedup key write: eoguard's scripts against plain pipelined commands.

    python -m bench.bench_redis_writes [--redis-url URL] [--batches 100] [--batch 1000]

A benchmark, not a test. It answers one question: how much of the Redis CPU a consumer costs
per message is the Lua scripts, and how much is Redis writing the keys. For ``--batches``
batches of ``--batch`` fresh message ids it measures the Redis server's CPU (INFO cpu, user +
system, main thread) per key for:

  claim (script)       DedupStore.claim: ``dedup_claim.lua``, one call per batch (SET NX PXAT
                       per message, one batch record per shard)
  claim (fresh)        DedupStore.claim of a fresh pass, as a consumer batch claims: the
                       ``dedup_open`` EVAL, then a pipelined ``SET NX GET PXAT`` per message
  claim (plain SET)    the same key writes as pipelined ``SET key value NX PXAT`` commands
  done (script)        DedupStore.done: ``dedup_done.lua`` (a GET per message, fenced; the
                       batch records marked done)
  done (plain SET)     what a done mark per key costs plain: ``SET key value XX KEEPTTL GET``
  done (fresh)         DedupStore.done after a fresh pass (the script's, as above)

Each pair runs on the same server, interleaved, batch by batch. Use a private Redis started
like the stack's (AOF, ``appendfsync always``): the figures include its AOF writes; the AOF
rewrites its child process makes are not in INFO cpu. Keys are deleted afterwards (untimed).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import redis

from bench.machine_cpu import redis_cpu_s
from eoguard.envelope import new_message_id
from eoguard.stack import LocalStack
from eoguard.store.dedup import Claim, DedupStore, position
from eoguard.store.keys import KeySpace

Step = Callable[[list[Claim]], None]


def plain_claim(client: redis.Redis[bytes], store: DedupStore) -> Step:
    def run(claims: list[Claim]) -> None:
        pipe = client.pipeline(transaction=False)
        deadline = int(time.time() * 1000) + store.lease_ms
        for claim in claims:
            pipe.set(claim.key, f"c|{deadline}|{claim.position}", nx=True,
                     pxat=claim.expires_at_ms + store.grace_ms)
        pipe.execute()
    return run


def plain_done(client: redis.Redis[bytes]) -> Step:
    def run(claims: list[Claim]) -> None:
        pipe = client.pipeline(transaction=False)
        done_at = int(time.time() * 1000)
        for claim in claims:
            pipe.set(claim.key, f"d|{done_at}|{claim.position}", xx=True, keepttl=True, get=True)
        pipe.execute()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="default: the local stack's Redis")
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    url = args.redis_url or LocalStack().up()[0].redis_url
    client = redis.Redis.from_url(url)
    keys = KeySpace(prefix=f"benchw{uuid.uuid4().hex[:6]}")
    store = DedupStore(client, scope="bench", keys=keys)
    expires = int(time.time() * 1000) + 3_600_000
    tokens: dict[int, str] = {}

    def script_claim(claims: list[Claim]) -> None:
        tokens[id(claims)] = store.new_token()
        store.claim(tokens[id(claims)], claims)

    def script_done(claims: list[Claim]) -> None:
        store.done(tokens.pop(id(claims)), claims)

    def fresh_claim(claims: list[Claim]) -> None:
        tokens[id(claims)] = store.new_token()
        store.claim(tokens[id(claims)], claims, fresh=True)

    fresh_claim([store.new_claim(new_message_id(), position("b", "t", 1, 0), expires)])
    steps: dict[str, tuple[Step, Step]] = {
        "script": (script_claim, script_done),
        "fresh": (fresh_claim, script_done),
        "plain SET": (plain_claim(client, store), plain_done(client)),
    }
    spent = {f"{step} ({way})": 0.0 for way in steps for step in ("claim", "done")}
    try:
        for n in range(args.batches):
            for way, (claim, done) in steps.items():
                claims = [store.new_claim(new_message_id(), position("b", "t", 0, n * args.batch + i),
                                          expires) for i in range(args.batch)]
                before = redis_cpu_s(client)
                claim(claims)
                middle = redis_cpu_s(client)
                done(claims)
                spent[f"claim ({way})"] += middle - before
                spent[f"done ({way})"] += redis_cpu_s(client) - middle
        total = args.batches * args.batch
        print(f"{total} keys per row, batches of {args.batch}; Redis CPU per key:")
        for name, seconds in spent.items():
            print(f"  {name:20s} {seconds / total * 1e6:6.2f} us")
    finally:
        names = list(client.scan_iter(match=keys.pattern(), count=10_000))
        for start in range(0, len(names), 5_000):
            client.unlink(*names[start:start + 5_000])
        client.close()


if __name__ == "__main__":
    main()
