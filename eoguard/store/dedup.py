"""The dedup store (v2): claims under a batch's token; the lease and the done mark are the batch's.

A claim key per (scope, message id) names the claim pass that took it (its *token*) and the
record's *position* as its reader sees it (:func:`position`); a batch record per (scope,
token, shard) holds the lease deadline, then the done mark (docs/design.md §4). The hot path writes
one key per message plus one per batch and shard: a handled message's done mark is its
batch's. Fencing stays per key: settling a batch touches only the claims still naming its
token. Every operation is one Lua call per batch (per hash slot on Redis Cluster); a batch's
calls go out pipelined in one round trip. Claim keys expire at ``expires_at`` + grace (never
past ``max_ttl`` + grace from now); a batch record outlives the claims it covers. The calls'
arguments and replies are laid out by the scripts' bindings (:mod:`eoguard.store.bindings.dedup`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from redis.cluster import RedisCluster

from eoguard.errors import ClaimNotOwnedError, InvalidInputError
from eoguard.store.bindings import dedup as bindings
from eoguard.store.client import RedisClient
from eoguard.store.dedup_admin import read_entries, read_records
from eoguard.store.dedup_fresh import prepare_fresh_claim
from eoguard.store.dedup_shards import Groups, ScopeShards
from eoguard.store.dedup_types import (
    BatchRecord,
    BatchState,
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
    IdState,
    Position,
    ReleaseResult,
    RenewResult,
    parse_position,
    position,
)
from eoguard.store.keys import KeySpace, check_scope
from eoguard.store.replicas import ReplicaWait
from eoguard.store.scripts import InFlight, Prepared, ScriptCall, Scripts

__all__ = [
    "BatchRecord",
    "BatchState",
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
    "IdState",
    "Position",
    "RecordKey",
    "ReleaseResult",
    "RenewResult",
    "parse_position",
    "position",
]

T = TypeVar("T")
RecordKey = tuple[int, str]
"""A batch record: its shard and its key (renewals group records by hash slot)."""


class DedupStore:
    """Claims, done marks, leases and releases of one consumer scope."""

    def __init__(self, client: RedisClient, *, scope: str, keys: KeySpace | None = None,
                 lease_ms: int = 30_000, grace_ms: int = 60_000,
                 wait: ReplicaWait | None = None) -> None:
        self.scope = check_scope(scope)  # ConfigError: a scope that cannot name keys
        self.client = client
        self.keys = keys or KeySpace()
        self.lease_ms = lease_ms
        self.grace_ms = grace_ms
        self._scripts = Scripts(client, wait=wait)  # wait: replicated durability
        # A script may touch keys of several hash slots on a single node, not on a cluster.
        self._shards = ScopeShards(self.keys, scope, one_call=not isinstance(client, RedisCluster))
        self._key_prefixes = self._shards.key_prefixes
        self._record_prefixes = self._shards.record_prefixes
        self._reowned_prefixes = self._shards.reowned_prefixes
        self._passed_prefixes = self._shards.passed_prefixes
        self.round_trips = 0
        self.redis_now_ms: int | None = None  # Redis's clock as last read (dedup_fresh.py)

    @staticmethod
    def new_token() -> str:
        """A fresh token for one claim pass (a consumer batch, a retry round)."""
        return secrets.token_hex(8)

    def key(self, message_id: str) -> str:
        return self.keys.dedup(self.scope, message_id)

    def new_claim(self, message_id: str, where: str, expires_at_ms: int) -> Claim:
        """A claim of this scope at position ``where``, its claim key located once."""
        shard = self.keys.shard_of(message_id)
        return Claim(message_id, where, expires_at_ms, shard, self._key_prefixes[shard] + message_id)

    def located_claims(self, ids: Sequence[str], where: Sequence[str],
                       expires_at_ms: Sequence[int], shards: Sequence[int]) -> list[Claim]:
        """:meth:`new_claim` per row, for ids whose shards the caller computed already
        (``KeySpace.shard_of``; Spark computes them in the JVM): no hash of the id here."""
        prefixes = self._key_prefixes
        return [Claim(message_id, at, expires, shard, prefixes[shard] + message_id)
                for message_id, at, expires, shard
                in zip(ids, where, expires_at_ms, shards, strict=True)]

    def effect_key(self, message_id: str, name: str) -> str:
        """An effect key in the hash slot of ``message_id``'s claim key (see KeySpace.effect)."""
        return self.keys.effect(self.scope, message_id, name)

    def records(self, token: str, claims: Sequence[Claim]) -> list[RecordKey]:
        """The batch records a claim pass under ``token`` writes for ``claims``."""
        shards = sorted({claim[3] if claim[3] >= 0 else self.keys.shard_of(claim[0])
                         for claim in claims})
        return [(shard, self._record_prefixes[shard] + token) for shard in shards]

    def batch_keys(self, token: str, shards: Sequence[int] | None = None) -> list[RecordKey]:
        """The batch records of the pass ``token`` on ``shards`` (default: every shard), for
        :meth:`renew` when the claims are not at hand (a Spark micro-batch's driver)."""
        _check_token(token)
        wanted = range(self.keys.shards) if shards is None else sorted(set(shards))
        return [(shard, self._record_prefixes[shard] + token) for shard in wanted]

    # Claim -----------------------------------------------------------------
    def claim(self, token: str, claims: Sequence[Claim], *, give_up_busy: bool = False,
              fresh: bool = False) -> list[ClaimOutcome]:
        """Claim a batch under ``token``: one script call (per hash slot on a cluster)."""
        return self._run(self.prepare_claim(token, claims, give_up_busy=give_up_busy,
                                            fresh=fresh), "claiming a batch").outcomes(claims)

    def prepare_claim(self, token: str, claims: Sequence[Claim], *, give_up_busy: bool = False,
                      fresh: bool = False) -> Prepared[ClaimReport]:
        """The calls of :meth:`claim`, to send with others in one round trip (:meth:`send`).

        ``give_up_busy``: a claim still BUSY (held by another token) is given up for good under
        ``token``: every later claim of its position under the token is PASSED. For a pass with
        several attempts (a Spark task): its attempts then agree on every row, whichever runs
        last (docs/design.md §7).

        ``fresh``: ``token`` was drawn for this pass and nothing was claimed under it (a
        consumer batch's). On a single node its new claims then go out as plain ``SET NX GET``
        commands, the others by the script in one more round trip, made when the replies are
        parsed (:mod:`eoguard.store.dedup_fresh`, which says what a reused token costs).
        """
        _check_token(token)
        if fresh and claims and not give_up_busy and self._shards.one_call:
            return prepare_fresh_claim(self, token, claims)
        groups = self._shards.group(claims)
        records, reowned, passed = self._record_prefixes, self._reowned_prefixes, self._passed_prefixes
        calls = [bindings.DedupClaim.build(
            token=token, lease_ms=self.lease_ms, grace_ms=self.grace_ms,
            max_ttl_ms=self.keys.max_ttl_ms, give_up_busy=give_up_busy, claims=claims,
            groups=[bindings.ClaimGroup(records[shard] + token, passed[shard] + token,
                                        records[shard], reowned[shard], *groups[shard])
                    for shard in shards])
            for shards in self._shards.calls(groups)]
        order, size = self._shards.order(groups), len(claims)
        return Prepared(calls, lambda replies: bindings.DedupClaim.parse(replies, order, size))

    # Done ------------------------------------------------------------------
    def done(self, token: str, claims: Sequence[Claim], *,
             handled: Sequence[bool] | None = None,
             effects: Mapping[str, Sequence[Effect]] | None = None,
             extra: Sequence[ScriptCall] = ()) -> list[DoneOutcome]:
        """Settle a batch's claims and mark it done (see :meth:`prepare_done`)."""
        report = self._run(self.prepare_done(token, claims, handled=handled, effects=effects,
                                             extra=extra), "marking a batch done")
        return report.outcomes(claims)

    def prepare_done(self, token: str, claims: Sequence[Claim], *,
                     handled: Sequence[bool] | None = None,
                     effects: Mapping[str, Sequence[Effect]] | None = None,
                     extra: Sequence[ScriptCall] = ()) -> Prepared[DoneReport]:
        """Settle every claim the pass ``token`` made and mark its batch records done.

        ``handled[i]`` false lets claim i go (failed, refused, dropped: deleted if still
        ours); None means all handled. Each handled message's ``effects`` (by id) apply in
        the same script, only if its claim still names the token. ``extra`` are more script
        calls sent in the same round trip (the outbox acknowledgement); their replies are
        discarded after error checking. On Redis Cluster every effect key must share its
        message's claim key hash tag (:meth:`effect_key`).
        """
        _check_token(token)
        groups = self._shards.group(claims)
        calls: list[ScriptCall] = []
        simple_calls: list[bool] = []
        call_members: list[list[int]] = []  # per call, its claims in the order of its keys
        grace, records, reowned = self.grace_ms, self._record_prefixes, self._reowned_prefixes
        for shards in self._shards.calls(groups):
            members = [i for shard in shards for i in groups[shard][0]]
            call_members.append(members)
            simple = handled is None or all(handled[i] for i in members)
            if simple and effects:
                simple = not any(effects.get(claims[i][0]) for i in members)
            # A lost record is written again with the latest claim PXAT, never past what a
            # claim may live: the script clamps it to Redis's now + max_ttl + grace, as the
            # claim script clamped the claims.
            calls.append(bindings.DedupDone.build(
                token=token, bound_ms=self.keys.max_ttl_ms + grace, simple=simple,
                claims=claims, handled=handled, effects=effects,
                groups=[bindings.DoneGroup(records[shard] + token, reowned[shard] + token,
                                           *groups[shard],
                                           max(claims[i][2] for i in groups[shard][0]) + grace)
                        for shard in shards]))
            simple_calls.append(simple)
        count = len(calls)
        calls += extra

        def parse(replies: list[Any]) -> DoneReport:
            return bindings.DedupDone.parse(replies[:count], simple_calls, call_members,
                                            len(claims),
                                            lambda i: claims[i][4] or self.key(claims[i][0]))

        return Prepared(calls, parse)

    def mark_done(self, token: str, shards: Sequence[int] | None = None) -> None:
        """Mark the batch records of the pass ``token`` on ``shards`` done (see
        :meth:`prepare_mark_done`)."""
        self._run(self.prepare_mark_done(token, shards), "marking a batch done")

    finish = mark_done
    """The earlier name of :meth:`mark_done` (public API: kept for callers)."""

    def prepare_mark_done(self, token: str, shards: Sequence[int] | None = None
                          ) -> Prepared[None]:
        """Mark done every batch record of the pass ``token`` on ``shards`` (default: every
        shard), without naming its claims: every claim still naming the token is done.

        For a pass whose claims are spread over many processes (a Spark micro-batch's tasks),
        sent once everything it claimed is handled; a claim it made but did not handle must be
        released first (:meth:`release`). ``dedup_done`` with groups of no claims: a record
        that is absent (nothing claimed on that shard) stays absent, a done one stays done.
        """
        _check_token(token)
        wanted = range(self.keys.shards) if shards is None else sorted(set(shards))
        groups: Groups = {shard: ([], []) for shard in wanted}
        records, reowned = self._record_prefixes, self._reowned_prefixes
        calls = [bindings.DedupDone.build(
            token=token, bound_ms=self.keys.max_ttl_ms + self.grace_ms, simple=True,
            groups=[bindings.DoneGroup(records[shard] + token, reowned[shard] + token, [], [], 0)
                    for shard in call_shards])
            for call_shards in self._shards.calls(groups)]
        return Prepared(calls, lambda _replies: None)

    def batch_records(self, token: str, shards: Sequence[int] | None = None
                      ) -> list[BatchRecord | None]:
        """The batch records of the pass ``token`` on ``shards`` (default: every shard), in
        shard order, None where there is none: one round trip."""
        names = [name for _, name in self.batch_keys(token, shards)]
        self.round_trips += 1
        records = read_records(self._scripts, self.client, names)
        return [records[name] for name in names]

    # Release, renew, give back ---------------------------------------------
    def release(self, token: str, claims: Sequence[Claim], *, strict: bool = False
                ) -> list[ReleaseResult]:
        """Give back claims of the pass ``token`` if still ours (its other claims go on);
        ``strict`` raises ClaimNotOwnedError on NOT_OWNED."""
        results = self._run(self.prepare_release(token, claims), "releasing claims")
        if strict:
            for claim, res in zip(claims, results, strict=True):
                if res is ReleaseResult.NOT_OWNED:
                    raise ClaimNotOwnedError(
                        f"claim on {claim.message_id} is not held by batch {token}",
                        message_id=claim.message_id, owner=token)
        return results

    def prepare_release(self, token: str, claims: Sequence[Claim]
                        ) -> Prepared[list[ReleaseResult]]:
        """The calls of :meth:`release`, to send with others in one round trip."""
        _check_token(token)
        groups = self._shards.group(claims)
        prefixes = self._record_prefixes
        calls = [bindings.DedupRelease.build(token=token, groups=[
            bindings.ReleaseGroup(prefixes[shard] + token, groups[shard][1]) for shard in shards])
            for shards in self._shards.calls(groups)]
        order, size = self._shards.order(groups), len(claims)
        return Prepared(calls, lambda replies: bindings.DedupRelease.parse(replies, order, size))

    def renew(self, records: Sequence[RecordKey], lease_ms: int | None = None
              ) -> list[RenewResult]:
        """Move the lease of open batch records to ``lease_ms`` (default: the store's) from
        now; one write per record. Done and absent records are left as they are."""
        return self._run(self.prepare_renew(records, lease_ms), "renewing batch leases")

    def give_back(self, records: Sequence[RecordKey]) -> list[RenewResult]:
        """End the lease of open batch records now: their open claims are free to take over."""
        return self.renew(records, 0)

    def prepare_renew(self, records: Sequence[RecordKey], lease_ms: int | None = None
                      ) -> Prepared[list[RenewResult]]:
        lease = self.lease_ms if lease_ms is None else lease_ms
        if self._shards.one_call:
            batches = [list(range(len(records)))] if records else []
        else:
            by_shard: dict[int, list[int]] = {}
            for i, (shard, _) in enumerate(records):
                by_shard.setdefault(shard, []).append(i)
            batches = list(by_shard.values())
        calls = [bindings.DedupRenew.build(records=[records[i][1] for i in members], lease_ms=lease)
                 for members in batches]
        size = len(records)
        return Prepared(calls, lambda replies: bindings.DedupRenew.parse(replies, batches, size))

    # Round trips -----------------------------------------------------------
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

    # Inspection (more in :mod:`eoguard.store.dedup_admin`) ------------------
    def check(self, message_id: str) -> DedupEntry | None:
        """The claim key of ``message_id`` in this scope with its batch record, or None."""
        self.round_trips += 2
        found = read_entries(self.client, self.keys, [self.key(message_id)])
        return found[0] if found else None

    def forget(self, message_id: str) -> bool:
        """Delete the claim key of ``message_id`` so this scope handles it again if it comes
        back (``eoguard dedup forget``); True when there was a key. A consumer still holding
        the claim finds it ABSENT at its done mark (nothing applied) and claims and handles
        it again. Either way a transactional handler's effects apply once."""
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.delete(self.key(message_id))
        self.round_trips += 1
        return bool(self._scripts.execute(pipe, doing="deleting a claim key")[0])

    # Internals -------------------------------------------------------------
    def _run(self, prepared: Prepared[T], doing: str) -> T:
        if not prepared.calls:
            return prepared.parse([])
        self.round_trips += 1
        return prepared.parse(self._scripts.run(prepared.calls, doing=doing))


def _check_token(token: str) -> None:
    """A token is a claim key's field: it must not hold the separator (or be empty)."""
    if not token or "|" in token or ":" in token:
        raise InvalidInputError(f"token {token!r} must be non-empty, without '|' or ':'")
