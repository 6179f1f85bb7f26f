"""The dedup store: per (scope, message id) claims in Redis, claimed -> done, fenced.

A dedup key goes absent -> ``claimed(owner, lease_deadline)`` -> ``done`` (DESIGN.md §4). The
owner token is the record's source position (scope, topic, partition, offset), so a redelivery
of the same record re-owns its claim while a true duplicate (another offset) is skipped, waited
on or taken over. Every operation is one Lua call per batch (per hash slot on Redis Cluster);
a batch's calls go out pipelined in one round trip. Keys expire at ``expires_at`` + grace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from redis.cluster import RedisCluster

from eoguard.errors import ClaimNotOwnedError, StoreError
from eoguard.store.client import RedisClient
from eoguard.store.dedup_types import (
    Claim,
    ClaimOutcome,
    ClaimReport,
    ClaimResult,
    DedupEntry,
    DedupState,
    DoneOutcome,
    DoneReport,
    DoneResult,
    Effect,
    ReleaseResult,
    RenewResult,
    owner_token,
)
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import InFlight, Prepared, ScriptArg, ScriptCall, Scripts

__all__ = [
    "Claim",
    "ClaimOutcome",
    "ClaimReport",
    "ClaimResult",
    "DedupEntry",
    "DedupState",
    "DedupStore",
    "DoneOutcome",
    "DoneReport",
    "DoneResult",
    "Effect",
    "ReleaseResult",
    "RenewResult",
    "owner_token",
    "read_entries",
    "scan_entries",
]

_CLAIM = tuple(ClaimResult)  # by code: enum lookups by value are slow on the hot path
_DONE = tuple(DoneResult)
_RELEASE = tuple(ReleaseResult)
_RENEW = tuple(RenewResult)
_BUSY_CODE = 48 + ClaimResult.BUSY.value  # as the scripts write it: an ASCII digit
_EFFECT_ERROR_CODE = 48 + DoneResult.EFFECT_ERROR.value

T = TypeVar("T")
Groups = dict[int, tuple[list[int], list[str]]]
"""Claims by script call: shard (or 0) -> (their indexes in the batch, their dedup keys)."""


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
        self._key_prefixes = self.keys.dedup_prefixes(scope)
        # A script may touch keys of several hash slots on a single node, not on a cluster.
        self._one_call = not isinstance(client, RedisCluster)
        self.round_trips = 0

    def key(self, message_id: str) -> str:
        return self.keys.dedup(self.scope, message_id)

    def new_claim(self, message_id: str, owner: str, expires_at_ms: int) -> Claim:
        """A claim of this scope with its dedup key located (used at claim, done, release)."""
        return Claim(message_id, owner, expires_at_ms, *self._locate(message_id))

    def effect_key(self, message_id: str, name: str) -> str:
        """An effect key in the hash slot of ``message_id``'s dedup key (see KeySpace.effect)."""
        return self.keys.effect(self.scope, message_id, name)

    # Claim -----------------------------------------------------------------
    def claim(self, claims: Sequence[Claim]) -> list[ClaimOutcome]:
        """Claim a batch: one script call per hash slot, all in one round trip; input order."""
        return self._run(self.prepare_claim(claims), "claiming a batch").outcomes(claims)

    def prepare_claim(self, claims: Sequence[Claim]) -> Prepared[ClaimReport]:
        """The calls of :meth:`claim`, to send with others in one round trip (:meth:`run`)."""
        groups = self._group(claims)
        calls = []
        grace = self.grace_ms
        for members, keys in groups.values():
            argv: list[ScriptArg] = [self.lease_ms, grace]
            for i in members:
                claim = claims[i]
                argv += (claim[1], claim[2] + grace)  # owner, the key's PXAT
            calls.append(ScriptCall("dedup_claim", keys, argv))

        def parse(replies: list[Any]) -> ClaimReport:
            results: list[Any] = [None] * len(claims)
            lease_ms: dict[int, int] = {}
            for (members, _), (codes, busy_ms) in zip(groups.values(), replies, strict=True):
                for i, code in zip(members, codes, strict=True):
                    results[i] = _CLAIM[code - 48]  # ASCII digits
                if busy_ms:
                    busy = iter(busy_ms)
                    for i, code in zip(members, codes, strict=True):
                        if code == _BUSY_CODE:
                            lease_ms[i] = int(next(busy))
            return ClaimReport(results, lease_ms)

        return Prepared(calls, parse)

    # Done ------------------------------------------------------------------
    def done(self, claims: Sequence[Claim],
             effects: Mapping[str, Sequence[Effect]] | None = None,
             *, extra: Sequence[ScriptCall] = ()) -> list[DoneOutcome]:
        """Mark claims done (fenced), applying each message's effects in the same script.

        ``extra`` are more script calls sent in the same round trip, e.g. the outbox
        acknowledgement; their replies are discarded after error checking. On Redis Cluster
        every effect key must share its message's dedup hash tag (:meth:`effect_key`).
        """
        report = self._run(self.prepare_done(claims, effects, extra=extra), "marking a batch done")
        return report.outcomes(claims)

    def prepare_done(self, claims: Sequence[Claim],
                     effects: Mapping[str, Sequence[Effect]] | None = None,
                     *, extra: Sequence[ScriptCall] = ()) -> Prepared[DoneReport]:
        """The calls of :meth:`done`, to send with others in one round trip (:meth:`run`)."""
        groups = self._group(claims)
        calls: list[ScriptCall] = []
        for members, dedup_keys in groups.values():
            if not effects:  # the common case: owners only
                owners: list[ScriptArg] = [len(members), 0]
                owners += [claims[i][1] for i in members]
                calls.append(ScriptCall("dedup_done", dedup_keys, owners))
                continue
            keys = list(dedup_keys)
            index: dict[str, int] = {}
            argv: list[ScriptArg] = [len(members), 1]
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

        with_reason = (_EFFECT_ERROR_CODE, 48 + DoneResult.PARTIAL.value)

        def parse(replies: list[Any]) -> DoneReport:
            results: list[Any] = [None] * len(claims)
            details: dict[int, str] = {}
            for (members, _), (codes, reasons) in zip(groups.values(), replies, strict=False):
                for i, code in zip(members, codes, strict=True):
                    results[i] = _DONE[code - 48]
                if reasons:  # one per EFFECT_ERROR or PARTIAL, in order
                    reason = iter(reasons)
                    for i, code in zip(members, codes, strict=True):
                        if code in with_reason:
                            details[i] = next(reason).decode()
            return DoneReport(results, details)

        return Prepared(calls, parse)

    # Release ---------------------------------------------------------------
    def release(self, claims: Sequence[Claim], *, strict: bool = False) -> list[ReleaseResult]:
        """Give claims back if still ours; ``strict`` raises ClaimNotOwnedError on NOT_OWNED."""
        results = self._run(self.prepare_release(claims), "releasing claims")
        if strict:
            for claim, res in zip(claims, results, strict=True):
                if res is ReleaseResult.NOT_OWNED:
                    raise ClaimNotOwnedError(
                        f"claim on {claim.message_id} is not held by {claim.owner}",
                        message_id=claim.message_id, owner=claim.owner)
        return results

    def prepare_release(self, claims: Sequence[Claim]) -> Prepared[list[ReleaseResult]]:
        """The calls of :meth:`release`, to send with others in one round trip (:meth:`run`)."""
        groups = self._group(claims)
        calls = [ScriptCall("dedup_release", keys, [claims[i].owner for i in members])
                 for members, keys in groups.values()]

        def parse(replies: list[Any]) -> list[ReleaseResult]:
            return _by_digit(groups, replies, _RELEASE, len(claims))

        return Prepared(calls, parse)

    def renew(self, claims: Sequence[Claim]) -> list[RenewResult]:
        """Move the lease of the claims their owner still holds; nothing else is written.

        For claims sent whose answer is not read yet: claiming them again (as a renewal of a
        claim known to be ours does) could create or take over a key their own answer
        reports as another owner's, and nobody would hold it then."""
        groups = self._group(claims)
        calls = [ScriptCall("dedup_renew", keys,
                            [self.lease_ms, *(claims[i].owner for i in members)])
                 for members, keys in groups.values()]

        def parse(replies: list[Any]) -> list[RenewResult]:
            return _by_digit(groups, replies, _RENEW, len(claims))

        return self._run(Prepared(calls, parse), "renewing claims")

    def run(self, prepared: Sequence[Prepared[Any]], doing: str = "claiming and marking done"
            ) -> list[Any]:
        """Send prepared calls (of this store or others) in one round trip; parsed replies."""
        if any(p.calls for p in prepared):
            self.round_trips += 1
        return self._scripts.run_prepared(prepared, doing=doing)

    def send(self, prepared: Sequence[Prepared[Any]], doing: str = "claiming and marking done"
             ) -> InFlight:
        """As :meth:`run`, but returns once the calls are sent: ``.wait()`` reads the replies."""
        if any(p.calls for p in prepared):
            self.round_trips += 1
        return self._scripts.send_prepared(prepared, doing=doing)

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
        back (``eoguard dedup forget``); True when there was a key. A consumer still holding
        the claim finds its done mark ABSENT (nothing applied) and claims and handles it
        again; if its lease renewal re-created the claim first, its done mark succeeds.
        Either way a transactional handler's effects apply once."""
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.delete(self.key(message_id))
        self.round_trips += 1
        return bool(self._scripts.execute(pipe, doing="deleting a dedup key")[0])

    # Internals -------------------------------------------------------------
    def _locate(self, message_id: str) -> tuple[int, str]:
        """The shard and the dedup key of ``message_id`` in this scope."""
        shard = self.keys.shard_of(message_id)
        return shard, self._key_prefixes[shard] + message_id

    def _group(self, claims: Sequence[Claim]) -> Groups:
        """The claims by script call: one call per hash slot on a cluster, else one call."""
        if self._one_call and claims:
            keys = [claim[4] or self._locate(claim[0])[1] for claim in claims]
            return {0: (list(range(len(claims))), keys)}
        groups: Groups = {}
        for i, claim in enumerate(claims):
            shard, key = (claim[3], claim[4]) if claim[4] else self._locate(claim[0])
            group = groups.get(shard)
            if group is None:
                groups[shard] = ([i], [key])
            else:
                group[0].append(i)
                group[1].append(key)
        return groups

    def _run(self, prepared: Prepared[T], doing: str) -> T:
        if not prepared.calls:
            return prepared.parse([])
        self.round_trips += 1
        return prepared.parse(self._scripts.run(prepared.calls, doing=doing))


def _by_digit(groups: Groups, replies: list[Any], table: tuple[T, ...], count: int) -> list[T]:
    """Per claim, in input order, the result its script call's reply gives it: the replies are
    strings of one ASCII digit (a code of ``table``) per claim of their group."""
    results: list[Any] = [None] * count
    for (members, _), codes in zip(groups.values(), replies, strict=True):
        for i, code in zip(members, codes, strict=True):
            results[i] = table[code - 48]
    return results


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
