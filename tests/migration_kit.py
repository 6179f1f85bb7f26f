"""Half-moving one hash slot of the shared Redis Cluster, the way ``redis-cli --cluster reshard`` does.

:meth:`SlotMove.begin` sets the slot IMPORTING on the target and MIGRATING on the source;
:meth:`SlotMove.migrate` MIGRATEs the keys a test names, so the test decides which half each key
a script touches is in; :meth:`SlotMove.finish` hands the slot over, :meth:`SlotMove.rollback`
brings the keys back. :func:`slot_move` (a fixture's body) puts the slot back on its first
master, stable everywhere, whatever a failed test left. :func:`attempt` and :func:`steps` run a
store call while the slot is half-moved and assert the rule of docs/design.md §4 "Redis
Cluster" (STYLE.md habit 12): the call answers, or it raises StoreError having written nothing
(:meth:`SlotMove.snapshot`: every key of the slot on both nodes).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
from redis.crc import key_slot

from eoguard.errors import StoreError
from eoguard.store.keys import KeySpace

T = TypeVar("T")
MIGRATE_TIMEOUT_MS = 5000
_CHUNK = 100  # keys per MIGRATE


@dataclass(frozen=True)
class Master:
    """A master of the cluster: its node id and address."""

    id: str
    host: str
    port: int

    def client(self) -> redis.Redis[bytes]:
        return redis.Redis(host=self.host, port=self.port)


@dataclass(frozen=True)
class KeyState:
    """A key as a snapshot holds it: its type, its value (DUMP) and its PEXPIRETIME; ``text``
    shows a string's or a hash's value (for messages only).

    PEXPIRETIME rather than a rounded PTTL: absolute, so two snapshots of an untouched key are
    equal however long apart they are taken, and any TTL a script moved shows."""

    type: str
    dump: bytes | None
    expire_at_ms: int
    text: str = field(default="", compare=False)


Snapshot = dict[tuple[str, str], KeyState]
"""(side: ``source`` or ``target``, key) -> its state."""


class Phase(enum.Enum):
    """Where the slot is: :meth:`SlotMove.restore` undoes each one."""

    HOME = "on the source"
    HALF = "half-moved"  # IMPORTING on the target, MIGRATING on the source
    HANDING_OVER = "being handed over"  # finish() is assigning the slot to the target
    MOVED = "on the target"


def slot_of(keys: KeySpace, scope: str, shard: int = 0) -> int:
    """The hash slot of ``scope``'s dedup keys on ``shard`` (hash tag ``{scope/shard}``)."""
    return key_slot(keys.dedup_batch_prefix(scope, shard).encode())


def masters(seed: redis.Redis[bytes]) -> list[Master]:
    """The cluster's masters with their slot ranges (CLUSTER SHARDS), by port."""
    return sorted((master for master, _ in _shards(seed)), key=lambda m: m.port)


def owner(seed: redis.Redis[bytes], slot: int) -> Master:
    """The master serving ``slot``, as ``seed`` sees the cluster (CLUSTER SHARDS)."""
    for master, ranges in _shards(seed):
        if any(start <= slot <= end for start, end in ranges):
            return master
    raise AssertionError(f"no master serves slot {slot}")


def _shards(seed: redis.Redis[bytes]) -> list[tuple[Master, list[tuple[int, int]]]]:
    out = []
    for reply in seed.execute_command("CLUSTER SHARDS"):
        shard = {_text(k): v for k, v in reply.items()}
        nodes = [{_text(k): v for k, v in node.items()} for node in shard["nodes"]]
        primary = next((n for n in nodes if _text(n["role"]) == "master"), None)
        if primary is None:
            continue
        bounds = [int(b) for b in shard["slots"]]
        out.append((Master(_text(primary["id"]), _text(primary["ip"]), int(primary["port"])),
                    list(zip(bounds[::2], bounds[1::2], strict=True))))
    return out


def free_scope(url: str, keys: KeySpace, shard: int = 0) -> str:
    """A fresh scope whose ``shard`` lies in a slot holding no key yet: moving it disturbs no
    other test sharing the cluster."""
    seed = redis.Redis.from_url(url)
    try:
        for _ in range(100):
            scope = f"mig-{uuid.uuid4().hex[:8]}"
            slot = slot_of(keys, scope, shard)
            node = owner(seed, slot).client()
            try:
                if int(node.execute_command("CLUSTER COUNTKEYSINSLOT", slot)) == 0:
                    return scope
            finally:
                node.close()
    finally:
        seed.close()
    raise AssertionError("no scope with an empty slot in 100 tries")


def assign(node: redis.Redis[bytes], slot: int, to: str, *, giving: bool) -> None:
    """CLUSTER SETSLOT ``slot`` NODE ``to`` on ``node``. A giving master that handed over its
    last slot may have turned into a replica of the receiver already (Redis 7's
    ``cluster-allow-replica-migration``): it refuses the SETSLOT and needs none (redis-cli
    --cluster reshard skips it likewise)."""
    try:
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", to)
    except redis.ResponseError as exc:
        if not (giving and "only with masters" in str(exc)):
            raise


class SlotMove:
    """One hash slot moved from the master serving it (the source) to another (the target)."""

    def __init__(self, url: str, slot: int) -> None:
        self.slot = slot
        seed = redis.Redis.from_url(url)
        try:
            every = masters(seed)
            self.source = owner(seed, slot)
        finally:
            seed.close()
        self.target = next(m for m in every if m != self.source)
        self.others = [m for m in every if m not in (self.source, self.target)]
        self._nodes = {m.id: m.client() for m in every}
        self.phase = Phase.HOME
        self.names: dict[str, str] = {}  # text -> the name messages show it by

    def name(self, **names: str) -> None:
        """Name keys or tokens in what the kit prints: ``move.name(TA=token)``."""
        self.names.update({text: label for label, text in names.items()})

    # The move ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """CLUSTER SETSLOT IMPORTING on the target, then MIGRATING on the source."""
        assert self.phase is Phase.HOME, self.phase
        self.phase = Phase.HALF  # from here on, restore() rolls back
        self._node(self.target).execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING",
                                                self.source.id)
        self._node(self.source).execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING",
                                                self.target.id)
        print(f"  slot {self.slot}: moving from :{self.source.port} to :{self.target.port}")

    def migrate(self, *keys: str) -> None:
        """MIGRATE ``keys`` (each on the source alone) to the target, in one command."""
        assert self.phase is Phase.HALF, self.phase
        for key in keys:
            assert self.where(key) == "source", f"{key} is {self.where(key)}, not on the source"
        self._migrate(self.source, self.target, list(keys))

    def finish(self) -> None:
        """Hand the slot over: MIGRATE what the source still holds, then CLUSTER SETSLOT NODE on
        the target, the source and the other masters. A key found on both nodes fails it (a
        script wrote on the target a key the source still held: one copy would be lost)."""
        assert self.phase is Phase.HALF, self.phase
        self._refuse_split()
        self._migrate(self.source, self.target, self._keys_on(self.source))
        self.phase = Phase.HANDING_OVER
        self._assign(self.target)
        self.phase = Phase.MOVED
        print(f"  slot {self.slot}: handed over to :{self.target.port}")

    def rollback(self) -> None:
        """CLUSTER SETSLOT STABLE on the source, the keys moved back from the target, STABLE on
        the target. A key found on both nodes fails it, as in :meth:`finish`."""
        assert self.phase is Phase.HALF, self.phase
        self._refuse_split()
        self._roll_back()
        print(f"  slot {self.slot}: rolled back to :{self.source.port}")

    def restore(self) -> None:
        """The slot back on the source with every key, stable on every master, whatever state
        a failed test left it in (a key on both nodes: the target's copy is kept)."""
        try:
            if self.phase is Phase.HALF:
                self._roll_back(replace=True)
            if self.phase is Phase.HANDING_OVER:  # finish() stopped while assigning
                self._assign(self.target)
                self.phase = Phase.MOVED
            if self.phase is Phase.MOVED:  # a move back, target -> source
                self._node(self.source).execute_command("CLUSTER SETSLOT", self.slot,
                                                        "IMPORTING", self.target.id)
                self._node(self.target).execute_command("CLUSTER SETSLOT", self.slot,
                                                        "MIGRATING", self.source.id)
                self._migrate(self.target, self.source, self._keys_on(self.target), replace=True)
                self._assign(self.source)
                self.phase = Phase.HOME
            self._check_home()
        finally:
            for node in self._nodes.values():
                node.close()

    # What is where ----------------------------------------------------------------------------
    def where(self, key: str) -> str:
        """``source``, ``target``, ``both`` or ``nowhere``: where ``key`` is now."""
        on = [side for side, master in self._sides() if key in self._keys_on(master)]
        if len(on) == 2:
            return "both"
        return on[0] if on else "nowhere"

    def snapshot(self) -> Snapshot:
        """Every key of the slot on both nodes, with its type, DUMP and PEXPIRETIME."""
        out: Snapshot = {}
        for side, master in self._sides():
            names = self._keys_on(master)
            commands = [("TYPE", "DUMP", "PEXPIRETIME", _READ.get(_text(kind), "TYPE"))
                        for kind in self._ask(master, [("TYPE", n) for n in names])]
            replies = self._ask(master, [(c, n) for cs, n in zip(commands, names, strict=True)
                                         for c in cs])
            for i, name in enumerate(names):
                kind, dump, expire_at, value = replies[4 * i:4 * i + 4]
                out[(side, name)] = KeyState(_text(kind), dump, int(expire_at),
                                            _value_text(value))
        return out

    def named(self, text: str) -> str:
        """``text`` with the keys and tokens the test named replaced by their names."""
        for raw in sorted(self.names, key=len, reverse=True):  # keys before the tokens in them
            text = text.replace(raw, self.names[raw])
        return text

    def changes(self, before: Snapshot, after: Snapshot) -> list[str]:
        """What differs between two snapshots, one line per key."""
        out = []
        for side, key in sorted(before.keys() | after.keys()):
            old, new = before.get((side, key)), after.get((side, key))
            if old != new:
                out.append(self.named(f"{side} {key}: {_state(old)} -> {_state(new)}"))
        return out

    # Internals --------------------------------------------------------------------------------
    def _sides(self) -> list[tuple[str, Master]]:
        return [("source", self.source), ("target", self.target)]

    def _node(self, master: Master) -> redis.Redis[bytes]:
        return self._nodes[master.id]

    def _ask(self, master: Master, commands: Sequence[tuple[str, str]]) -> list[Any]:
        """Run one-key ``commands`` on ``master``, each after ASKING (the target answers
        for a slot it imports only when asked)."""
        pipe: Any = self._node(master).pipeline(transaction=False)
        for command in commands:
            pipe.execute_command("ASKING")
            pipe.execute_command(*command)
        return list(pipe.execute()[1::2])

    def _keys_on(self, master: Master) -> list[str]:
        names = self._node(master).execute_command("CLUSTER GETKEYSINSLOT", self.slot, 100_000)
        return [_text(name) for name in names]

    def _refuse_split(self) -> None:
        split = set(self._keys_on(self.source)) & set(self._keys_on(self.target))
        if split:
            states = self.snapshot()
            raise AssertionError(self.named(
                "keys on both nodes of the half-moved slot (a script wrote on the target a key "
                "the source still held; one copy would be lost): "
                + "; ".join(f"{k}: source {_state(states[('source', k)])}, "
                            f"target {_state(states[('target', k)])}" for k in sorted(split))))

    def _migrate(self, src: Master, dst: Master, keys: Sequence[str], *,
                 replace: bool = False) -> None:
        for at in range(0, len(keys), _CHUNK):
            options = ["REPLACE"] if replace else []
            self._node(src).execute_command("MIGRATE", dst.host, dst.port, "", 0,
                                            MIGRATE_TIMEOUT_MS, *options, "KEYS",
                                            *keys[at:at + _CHUNK])

    def _roll_back(self, *, replace: bool = False) -> None:
        # The source STABLE first: MIGRATING, it would answer the keys coming back with ASK.
        # The target, still IMPORTING, may MIGRATE keys of the slot.
        self._node(self.source).execute_command("CLUSTER SETSLOT", self.slot, "STABLE")
        self._migrate(self.target, self.source, self._keys_on(self.target), replace=replace)
        self._node(self.target).execute_command("CLUSTER SETSLOT", self.slot, "STABLE")
        self.phase = Phase.HOME

    def _assign(self, to: Master) -> None:
        """CLUSTER SETSLOT NODE on the receiving node, the giving one, then the others (the
        order of redis-cli --cluster reshard)."""
        giving = self.source if to == self.target else self.target
        for master in (to, giving, *self.others):
            assign(self._node(master), self.slot, to.id, giving=master == giving)

    def _check_home(self) -> None:
        """Every master sees the slot on the source, and none keeps a migration state."""
        for master in (self.source, self.target, *self.others):
            node = self._node(master)
            assert owner(node, self.slot) == self.source, (master, self.slot)
            nodes = node.execute_command("CLUSTER NODES")  # redis-py parses it: a dict
            mine = next(n for n in nodes.values() if "myself" in n["flags"])
            assert not [m for m in mine["migrations"] if int(m["slot"]) == self.slot], mine


@contextmanager
def slot_move(url: str, slot: int) -> Iterator[SlotMove]:
    """A :class:`SlotMove` of ``slot`` (not begun: the test sets its keys up first), put back
    on its source afterwards, also when the test fails."""
    move = SlotMove(url, slot)
    try:
        yield move
    finally:
        move.restore()


# Calls while the slot is half-moved -----------------------------------------------------------
def attempt(move: SlotMove, call: Callable[[], T], what: str) -> T | None:
    """Run ``call`` with the slot half-moved: its answer, or None when it raised StoreError,
    after asserting it wrote nothing (a script never fails after its first write)."""
    before = move.snapshot()
    try:
        answer = call()
    except StoreError as exc:
        failure = f"{type(exc).__name__} ({_reason(exc)})"
    else:
        print(f"    {what}: {show(answer)}")
        return answer
    written = move.changes(before, move.snapshot())
    print(f"    {what}: {failure}; written: {'; '.join(written) or 'nothing'}")
    assert not written, f"{what} raised {failure} after writing: {written}"
    return None


def steps(move: SlotMove, keys: Mapping[str, str], call: Callable[[], T], what: str) -> T | None:
    """MIGRATE ``keys`` (label -> key) one at a time, in order, running ``call`` after each
    step (:func:`attempt`) until it answers: its first answer, or None when it failed, having
    written nothing, after every step."""
    move.names.update({key: label for label, key in keys.items()})
    for label, key in keys.items():
        move.migrate(key)
        print(f"  {label} -> target")
        answer = attempt(move, call, what)
        if answer is not None:
            return answer
    return None


def show(value: Any) -> str:
    """An answer of :func:`steps` as a message shows it: enums by name, None (StoreError at
    every step) as such."""
    if value is None:
        return "StoreError (nothing written)"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, enum.Enum):
        return value.name
    return str(value)


_READ = {"string": "GET", "hash": "HGETALL", "set": "SMEMBERS"}  # a value as text, by type


def _reason(exc: BaseException) -> str:
    return str(exc).split(": ", 1)[-1][:100]


def _state(state: KeyState | None) -> str:
    if state is None:
        return "absent"
    return f"{state.type} {state.text!r} pexpiretime {state.expire_at_ms}"


def _value_text(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{_text(k)}: {_text(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (set, list)):
        return "{" + ", ".join(sorted(_text(v) for v in value)) + "}"
    return _text(value)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
