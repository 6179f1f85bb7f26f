"""Resharding under load (cluster topology): the run's hash slots move between masters while
its producers and consumers run, and a fourth master joins, takes its share, and leaves.

The run's keys live in few slots, whatever its prefix: each scope's ``{scope/shard}`` tags
(claim keys, batch records, re-owned and passed hashes, effect keys), the outbox's ``{shard}``
tags (records and resend index) and the liveness and layout tags (:func:`run_slots`). A
:class:`SlotMover` moves one of them the way ``redis-cli --cluster reshard`` does, only slowly:
CLUSTER SETSLOT IMPORTING on the target and MIGRATING on the source, a hold with every key
still on the source (a new key then goes to the target through ASK, a script over keys on both
sides gets TRYAGAIN), then MIGRATE a few keys at a time with pauses, so the slot stays half-moved
for seconds and the scripts of the run meet every state of it; then CLUSTER SETSLOT NODE on the
target, the source and the others. A key MIGRATE finds on both nodes is a split (a script wrote
on the target a key the source still held: one copy would be lost) and becomes a violation.

:func:`reshard` is the fault: the fourth master joins with its replica
(:class:`eoguard.stack.redis_shard.AddedShard`); some of the run's slots move to it slowly and
``redis-cli --cluster rebalance`` gives it the rest of its share; for ``hold_s`` run slots move
slowly between the other masters; then the new master's run slots move slowly back to the
others, the rest by rebalance, and it leaves.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer
from eoguard.stack.redis_shard import AddedShard
from eoguard.store.keys import KeySpace
from tests.migration_kit import Master, assign, masters, owner, slot_of

MIGRATE_TIMEOUT_MS = 10_000  # two busy cores: a MIGRATE of a few keys may wait a while


def run_slots(keys: KeySpace, scopes: tuple[str, ...]) -> dict[int, str]:
    """Every hash slot the run's keys live in, with what lives there."""
    out: dict[int, str] = {}
    for scope in scopes:
        for shard in range(keys.shards):
            out.setdefault(slot_of(keys, scope, shard), f"{scope}/{shard}")
    for shard in range(keys.shards):
        out.setdefault(key_slot(keys.outbox_index(shard).encode()), f"outbox {shard}")
    for name, key in (("live producers", keys.live_producers()),
                      ("live consumers", keys.live_consumers()), ("layout", keys.layout())):
        out.setdefault(key_slot(key.encode()), name)
    return out


@dataclass
class Moved:
    """One slot moved: from where to where, how many keys, how long it was half-moved."""

    slot: int
    what: str
    source: int
    target: int
    keys: int = 0
    half_moved_s: float = 0.0

    def __str__(self) -> str:
        return (f"{self.what} (slot {self.slot}) :{self.source}->:{self.target} "
                f"{self.keys} keys, half-moved {self.half_moved_s:.1f} s")


@dataclass
class Reshard:
    """What one resharding fault did, and what it found wrong; ``redirects``: the ASK,
    TRYAGAIN and MOVED replies the masters gave meanwhile (INFO errorstats), so many times a
    client met a slot moving."""

    moved: list[Moved] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    redirects: Counter[str] = field(default_factory=Counter)


REDIRECTS = ("ASK", "TRYAGAIN", "MOVED")


def error_replies(nodes: list[RedisServer]) -> Counter[str]:
    """The ASK, TRYAGAIN and MOVED replies ``nodes`` gave since they started."""
    out: Counter[str] = Counter()
    for node in nodes:
        client = node.client(timeout_s=2.0)
        try:
            stats = client.info("errorstats")
        except redis.RedisError:
            continue
        finally:
            client.close()
        for kind in REDIRECTS:
            out[kind] += int(stats.get(f"errorstat_{kind}", {}).get("count", 0))
    return out


class SlotMover:
    """Moves hash slots of a cluster between its masters, a few keys at a time."""

    def __init__(self, url: str, found: Reshard) -> None:
        self.seed = redis.Redis.from_url(url)
        self.found = found
        self._clients: dict[str, redis.Redis[bytes]] = {}

    def close(self) -> None:
        for client in [self.seed, *self._clients.values()]:
            client.close()

    def masters(self) -> list[Master]:
        return masters(self.seed)

    def owner(self, slot: int) -> Master:
        return owner(self.seed, slot)

    def _node(self, master: Master) -> redis.Redis[bytes]:
        if master.id not in self._clients:
            self._clients[master.id] = redis.Redis(host=master.host, port=master.port,
                                                   socket_timeout=30)
        return self._clients[master.id]

    def move(self, slot: int, what: str, target: Master, rng: random.Random, *,
             hold_s: float, batch: int, pause_s: float) -> Moved | None:
        """Move ``slot`` to ``target``: half-moved ``hold_s`` with every key on the source,
        then ``batch`` keys per MIGRATE with ``pause_s`` between; None if it is there."""
        source = self.owner(slot)
        if source.id == target.id:
            return None
        note = Moved(slot, what, source.port, target.port)
        started = time.monotonic()
        self._node(target).execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.id)
        self._node(source).execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.id)
        time.sleep(hold_s)
        while True:
            names = self._node(source).execute_command("CLUSTER GETKEYSINSLOT", slot, batch)
            if not names:
                break
            note.keys += self._migrate(source, target, list(names), slot, what)
            time.sleep(pause_s * rng.uniform(0.5, 1.5))
        note.half_moved_s = time.monotonic() - started
        self._assign(slot, target, source)
        self.found.moved.append(note)
        return note

    def _migrate(self, source: Master, target: Master, names: list[bytes], slot: int,
                 what: str) -> int:
        try:
            self._node(source).execute_command("MIGRATE", target.host, target.port, "", 0,
                                               MIGRATE_TIMEOUT_MS, "KEYS", *names)
            return len(names)
        except redis.ResponseError as exc:
            if "BUSYKEY" not in str(exc):
                raise
        # Some key is on both nodes: find which, keep the source's copy (it was there first)
        # after recording both, and go on.
        for name in names:
            there = self._ask(target, "DUMP", name)
            if there is not None:
                here = self._node(source).execute_command("DUMP", name)
                self.found.violations.append(
                    f"reshard: {name.decode()} of {what} (slot {slot}) was on both nodes while "
                    f"it moved :{source.port}->:{target.port} (a script wrote on the target a "
                    f"key the source held): source {here!r:.80}, target {there!r:.80}")
        self._node(source).execute_command("MIGRATE", target.host, target.port, "", 0,
                                           MIGRATE_TIMEOUT_MS, "REPLACE", "KEYS", *names)
        return len(names)

    def _ask(self, master: Master, *command: object) -> object:
        pipe = self._node(master).pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command(*command)
        return pipe.execute()[1]

    def _assign(self, slot: int, to: Master, source: Master) -> None:
        """CLUSTER SETSLOT NODE on the target, the source, then the other masters (the order
        of redis-cli --cluster reshard)."""
        others = [m for m in self.masters() if m.id not in (to.id, source.id)]
        for master in (to, source, *others):
            assign(self._node(master), slot, to.id, giving=master == source)

    def open_slots(self) -> list[tuple[Master, int]]:
        """(master, slot) of every slot a master still has importing or migrating."""
        out = []
        for master in self.masters():
            nodes = self._node(master).execute_command("CLUSTER NODES")
            mine = next(n for n in nodes.values() if "myself" in n["flags"])
            out += [(master, int(m["slot"])) for m in mine["migrations"]]
        return out


def reshard(cluster: RedisClusterNodes, url: str, slots: dict[int, str], rng: random.Random,
            hold_s: float, *, moves_in: int = 3, weight: float = 1.0) -> Reshard:
    """The fault: a fourth master joins, takes ``moves_in`` of the run's slots slowly and its
    share of the rest by rebalance (``weight`` against 1 for each other master: CI's short runs
    give it a smaller share, each slot costing a few fsyncs of every node's ``nodes.conf``);
    for ``hold_s`` run slots move slowly between the other masters; then its run slots move
    slowly back, the rest by rebalance, and it leaves."""
    found = Reshard()
    shard = AddedShard(cluster)
    mover = SlotMover(url, found)

    def slow(slot: int, target: Master) -> bool:
        moved = mover.move(slot, slots[slot], target, rng, hold_s=rng.uniform(0.5, 2.0),
                           batch=rng.choice([3, 5, 10]), pause_s=0.1)
        if moved is not None:
            found.steps.append(str(moved))
        return moved is not None

    before = error_replies(cluster.servers)
    try:
        started = time.monotonic()
        new_id = shard.join()
        found.steps.append(f"joined master :{shard.master.port} (replica :{shard.replica.port}) "
                           f"in {time.monotonic() - started:.1f} s")
        new = Master(new_id, "127.0.0.1", shard.master.port)
        # Step 1. Some run slots to the new master, slowly; the rest of its share by rebalance.
        for slot in rng.sample(sorted(slots), moves_in):
            slow(slot, new)
        at = time.monotonic()
        shard.rebalance_in(weight)
        found.steps.append(f"rebalanced in: {shard.slots_of(new_id)} slots on the new master "
                           f"({time.monotonic() - at:.1f} s)")
        # Step 2. For hold_s, run slots between the other masters, slowly.
        until, between = time.monotonic() + hold_s, 0
        while time.monotonic() < until or not between:
            slot = rng.choice(sorted(slots))
            source = mover.owner(slot)
            if source.id != new_id:
                others = [m for m in mover.masters() if m.id not in (source.id, new_id)]
                between += slow(slot, rng.choice(others))
        # Step 3. The new master's run slots back to the others, slowly; then it leaves.
        olds = [m for m in mover.masters() if m.id != new_id]
        on_new = [s for s in sorted(slots) if mover.owner(s).id == new_id]
        for slot in rng.sample(on_new, min(moves_in, len(on_new))):
            slow(slot, rng.choice(olds))
        shard.wait_agreed()
        found.redirects += error_replies([shard.master])  # before it leaves with its counts
        at = time.monotonic()
        shard.leave()
        found.steps.append(f"the new master left ({time.monotonic() - at:.1f} s)")
    except BaseException:
        _repair(shard, mover)
        raise
    finally:
        mover.close()
    found.redirects += error_replies(cluster.servers)
    found.redirects -= before
    return found


def _repair(shard: AddedShard, mover: SlotMover) -> None:
    """After a failed reshard: close the open slots (``redis-cli --cluster fix``) and remove
    the added shard, so the next test finds the cluster whole."""
    try:
        if mover.open_slots():
            shard.fix()
        shard.leave()
    except Exception as exc:  # the original failure is the one to raise
        print(f"  reshard: repairing the cluster failed too: {exc!r}", flush=True)
