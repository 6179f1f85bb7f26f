"""The dedup store: per (scope, message id) claims in Redis, claimed -> done, fenced.

A dedup key goes absent -> ``claimed(owner, lease_deadline)`` -> ``done`` (DESIGN.md §4). The
owner token is the record's source position (scope, topic, partition, offset), so a redelivery
of the same record re-owns its claim while a true duplicate (another offset) is skipped, waited
on or taken over. Every operation is one Lua call per hash slot; a batch's calls go out
pipelined in one round trip. Keys expire at ``expires_at`` + grace.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

from eoguard.errors import ClaimNotOwnedError, StoreError
from eoguard.store.client import RedisClient
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import ScriptArg, ScriptCall, Scripts


class ClaimResult(enum.Enum):
    """Outcome of claiming one message; the values are the codes ``dedup_claim.lua`` returns."""

    NEW = 0
    MINE = 1
    DONE = 2
    BUSY = 3
    TAKEN_OVER = 4
    EXPIRED = 5

    @property
    def should_handle(self) -> bool:
        """Whether the claimant now holds the claim and runs the handler."""
        return self in (ClaimResult.NEW, ClaimResult.MINE, ClaimResult.TAKEN_OVER)


class DoneResult(enum.Enum):
    """Outcome of marking one message done; the codes of ``dedup_done.lua``."""

    OK = 0
    NOT_OWNED = 1
    ALREADY_DONE = 2
    EFFECT_ERROR = 3


class ReleaseResult(enum.Enum):
    """Outcome of releasing one claim; the codes of ``dedup_release.lua``."""

    OK = 0
    NOT_OWNED = 1
    ALREADY_DONE = 2


_CLAIM = tuple(ClaimResult)  # by code: enum lookups by value are slow on the hot path
_DONE = tuple(DoneResult)
_RELEASE = tuple(ReleaseResult)


class DedupState(enum.Enum):
    """What a dedup key holds."""

    CLAIMED = "c"
    DONE = "d"


def owner_token(scope: str, topic: str, partition: int, offset: int) -> str:
    """The claim owner of a record: its source position (DESIGN.md §4)."""
    return f"{scope}|{topic}|{partition}|{offset}"


class Claim(NamedTuple):
    """One message to claim: its id, its owner token and its expiry (a tuple: hot path).

    ``shard`` and ``key`` locate its dedup key; :meth:`DedupStore.new_claim` fills them once
    per message, otherwise the store computes them at every call.
    """

    message_id: str
    owner: str
    expires_at_ms: int
    shard: int = -1
    key: str = ""


class ClaimOutcome(NamedTuple):
    """The claim and its result; ``lease_ms`` is the other owner's lease left when BUSY."""

    claim: Claim
    result: ClaimResult
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Effect:
    """One single-key Redis write applied atomically with the done mark."""

    command: str
    key: str
    args: tuple[str | bytes | int | float, ...] = ()


class DoneOutcome(NamedTuple):
    """The claim, whether it was marked done, and the reason when an effect was refused."""

    claim: Claim
    result: DoneResult
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DedupEntry:
    """A dedup key as the CLI shows it."""

    message_id: str
    key: str
    state: DedupState
    owner: str
    at_ms: int  # lease deadline when claimed, done time when done
    expire_at_ms: int  # PEXPIRETIME: expires_at + grace; -1 = no TTL

    @property
    def scope(self) -> str:
        """The consumer scope: the owner token starts with it (``scope|topic|partition|offset``)."""
        return self.owner.split("|", 1)[0]


class DedupStore:
    """Claims, done marks and releases of one consumer scope."""

    def __init__(self, client: RedisClient, *, scope: str, keys: KeySpace | None = None,
                 lease_ms: int = 30_000, grace_ms: int = 60_000) -> None:
        if not scope or "|" in scope:
            raise StoreError(f"scope {scope!r} must be non-empty and without '|'")
        self.client = client
        self.scope = scope
        self.keys = keys or KeySpace()
        self.lease_ms = lease_ms
        self.grace_ms = grace_ms
        self._scripts = Scripts(client)
        self.round_trips = 0

    def key(self, message_id: str) -> str:
        return self.keys.dedup(self.scope, message_id)

    def new_claim(self, message_id: str, owner: str, expires_at_ms: int) -> Claim:
        """A claim of this scope with its dedup key located (used at claim, done, release)."""
        keys = self.keys
        return Claim(message_id, owner, expires_at_ms, keys.shard_of(message_id),
                     keys.dedup(self.scope, message_id))

    def effect_key(self, message_id: str, name: str) -> str:
        """An effect key in the hash slot of ``message_id``'s dedup key (see KeySpace.effect)."""
        return self.keys.effect(self.scope, message_id, name)

    # Claim -----------------------------------------------------------------
    def claim(self, claims: Sequence[Claim]) -> list[ClaimOutcome]:
        """Claim a batch: one script call per hash slot, all in one round trip; input order."""
        groups = self._group(claims)
        calls = []
        for members, keys in groups.values():
            argv: list[ScriptArg] = [self.lease_ms, self.grace_ms]
            argv += chain.from_iterable((claims[i][1], claims[i][2]) for i in members)
            calls.append(ScriptCall("dedup_claim", keys, argv))
        replies = self._run(calls, "claiming a batch")
        out: list[Any] = [None] * len(claims)
        for (members, _), (codes, busy_ms) in zip(groups.values(), replies, strict=True):
            busy = iter(busy_ms)
            for i, code in zip(members, codes, strict=True):
                result = _CLAIM[code - 48]  # ASCII digits
                out[i] = ClaimOutcome(claims[i], result,
                                      int(next(busy)) if result is ClaimResult.BUSY else 0)
        return out

    # Done ------------------------------------------------------------------
    def done(self, claims: Sequence[Claim],
             effects: Mapping[str, Sequence[Effect]] | None = None,
             *, extra: Sequence[ScriptCall] = ()) -> list[DoneOutcome]:
        """Mark claims done (fenced), applying each message's effects in the same script.

        ``extra`` are more script calls sent in the same round trip, e.g. the outbox
        acknowledgement; their replies are discarded after error checking. On Redis Cluster
        every effect key must share its message's dedup hash tag (:meth:`effect_key`).
        """
        effects = effects or {}
        groups = self._group(claims)
        calls: list[ScriptCall] = []
        for members, dedup_keys in groups.values():
            keys = list(dedup_keys)
            index: dict[str, int] = {}
            argv: list[ScriptArg] = [len(members)]
            if not effects:  # the common case: owners only
                argv += chain.from_iterable((claims[i][1], 0) for i in members)
                calls.append(ScriptCall("dedup_done", keys, argv))
                continue
            for i in members:
                own = effects.get(claims[i].message_id, ())
                argv += (claims[i].owner, len(own))
                for eff in own:
                    if eff.key not in index:
                        keys.append(eff.key)
                        index[eff.key] = len(keys)
                    argv += (eff.command.upper(), index[eff.key], len(eff.args), *eff.args)
            calls.append(ScriptCall("dedup_done", keys, argv))
        calls += extra
        replies = self._run(calls, "marking a batch done")
        out: list[Any] = [None] * len(claims)
        for (members, _), (codes, details) in zip(groups.values(), replies, strict=False):
            reasons = iter(details)
            for i, code in zip(members, codes, strict=True):
                result = _DONE[code - 48]
                reason = next(reasons) if result is DoneResult.EFFECT_ERROR else b""
                out[i] = DoneOutcome(claims[i], result, reason.decode())
        return out

    # Release ---------------------------------------------------------------
    def release(self, claims: Sequence[Claim], *, strict: bool = False) -> list[ReleaseResult]:
        """Give claims back if still ours; ``strict`` raises ClaimNotOwnedError on NOT_OWNED."""
        groups = self._group(claims)
        calls = [ScriptCall("dedup_release", keys, [claims[i].owner for i in members])
                 for members, keys in groups.values()]
        replies = self._run(calls, "releasing claims")
        results: list[Any] = [None] * len(claims)
        for (members, _), codes in zip(groups.values(), replies, strict=True):
            for i, code in zip(members, codes, strict=True):
                results[i] = _RELEASE[code - 48]
        if strict:
            for claim, res in zip(claims, results, strict=True):
                if res is ReleaseResult.NOT_OWNED:
                    raise ClaimNotOwnedError(
                        f"claim on {claim.message_id} is not held by {claim.owner}",
                        message_id=claim.message_id, owner=claim.owner)
        return results

    # Inspection ------------------------------------------------------------
    def check(self, message_id: str) -> DedupEntry | None:
        """The dedup key of ``message_id`` in this scope, or None when absent."""
        key = self.key(message_id)
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.execute_command("PEXPIRETIME", key)
        self.round_trips += 1
        value, expire_at = self._scripts.execute(pipe, doing=f"reading dedup key {key}")
        if value is None:
            return None
        text = value.decode() if isinstance(value, bytes) else str(value)
        state, at_ms, owner = text.split("|", 2)
        return DedupEntry(message_id=message_id, key=key, state=DedupState(state), owner=owner,
                          at_ms=int(at_ms), expire_at_ms=int(expire_at))

    def forget(self, message_id: str) -> bool:
        """Delete the dedup key of ``message_id`` so this scope handles it again if it comes
        back (``eoguard dedup forget``); True when there was a key. A consumer holding the
        claim then finds its done mark refused (NOT_OWNED), never a double effect."""
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.delete(self.key(message_id))
        self.round_trips += 1
        return bool(self._scripts.execute(pipe, doing="deleting a dedup key")[0])

    # Internals -------------------------------------------------------------
    def _group(self, claims: Sequence[Claim]) -> dict[int, tuple[list[int], list[str]]]:
        """Claims by hash slot: (their indexes, their dedup keys) per shard."""
        groups: dict[int, tuple[list[int], list[str]]] = {}
        for i, claim in enumerate(claims):
            shard, key = claim.shard, claim.key
            if not key:
                shard, key = self.keys.shard_of(claim.message_id), self.key(claim.message_id)
            group = groups.get(shard)
            if group is None:
                groups[shard] = ([i], [key])
            else:
                group[0].append(i)
                group[1].append(key)
        return groups

    def _run(self, calls: Sequence[ScriptCall], doing: str) -> list[Any]:
        if not calls:
            return []
        self.round_trips += 1
        return self._scripts.run(calls, doing=doing)


def scan_entries(client: RedisClient, keys: KeySpace, *, scope: str | None = None,
                 count: int = 1000) -> Iterator[list[DedupEntry]]:
    """Every dedup key of ``scope`` (or of all scopes), one list per SCAN call (may be empty).

    For the CLI: SCAN (never KEYS) by :meth:`KeySpace.dedup_pattern`, then
    :func:`read_entries` per batch. A key that expires in between is left out.
    """
    scripts = Scripts(client)
    cursor: Any = 0
    while True:
        pipe: Any = client.pipeline(transaction=False)
        pipe.scan(cursor, match=keys.dedup_pattern(scope), count=count)
        cursor, names = scripts.execute(pipe, doing="scanning dedup keys")[0]
        yield read_entries(client, keys, names)
        if int(cursor) == 0:
            return


def read_entries(client: RedisClient, keys: KeySpace, names: Sequence[str | bytes]
                 ) -> list[DedupEntry]:
    """The dedup keys ``names`` (found by SCAN): one pipelined GET + PEXPIRETIME each.

    The message id is the key's last segment, checked by rebuilding the key with
    :meth:`KeySpace.dedup`; absent keys and keys that do not round-trip are left out.
    """
    if not names:
        return []
    pipe: Any = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
        pipe.execute_command("PEXPIRETIME", name)
    replies = Scripts(client).execute(pipe, doing="reading dedup keys")
    out: list[DedupEntry] = []
    for i, name in enumerate(names):
        value, expire_at = replies[2 * i], replies[2 * i + 1]
        if value is None:
            continue
        key = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        state, at_ms, owner = text.split("|", 2)
        entry = DedupEntry(message_id=key.rsplit(":", 1)[-1], key=key, state=DedupState(state),
                           owner=owner, at_ms=int(at_ms), expire_at_ms=int(expire_at))
        if keys.dedup(entry.scope, entry.message_id) == key:
            out.append(entry)
    return out
