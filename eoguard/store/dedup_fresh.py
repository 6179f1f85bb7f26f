"""A fresh claim pass's new claims as plain commands: one ``SET NX GET PXAT`` a claim.

Most claims of a consumer batch find no key. For those, ``dedup_claim.lua``'s work (an MGET,
its checks, a SET issued from Lua) costs Redis about twice what a pipelined ``SET`` does. So a
*fresh* pass (a token nothing was claimed under: a consumer batch's) on a single node sends,
in its round trip::

    EVAL dedup_open                                    its batch records, by Redis's clock
    SET <claim key> c|<token>|<position> NX GET PXAT <expires_at + grace>   a claim each

and claims by ``dedup_claim`` in one more round trip, under the same token, each claim whose
SET found a key (a redelivery, a duplicate, an id twice in the batch) or that was not sent so
(below). docs/design.md §4 ("A fresh pass's claims") states the rules; each holds what the
script holds:

- A claim key never names a token without its record: the open script runs first on the same
  connection, and it is an ``EVAL`` of the source, so a server that lost its scripts runs it
  too (an EVALSHA answered NOSCRIPT would leave the SETs after it claiming for no record, and
  another pass takes such claims over as lapsed).
- Expiry by Redis's clock: a claim that landed NEW for a message whose ``expires_at`` is not
  after the open script's clock is deleted in the second round trip (``dedup_release``) and
  reported EXPIRED: what the script answers, having written nothing.
- The bound: a claim goes by SET only when its PXAT is within ``max_ttl + grace`` of the last
  clock of Redis this store read; the others go to the script, which clamps them. (A first
  pass has read no clock: it goes to the script, with a ``TIME``.) A SET's claim past the
  bound by the open's clock (Redis's clock stepped back since it was read) is released and
  claimed by the script in the second round trip, so none outlives its record.
- Atomic per key, as the script's read and write of each key are; a fresh token is not done
  (STALE) and gave nothing up (PASSED), the two outcomes that need the pass's state.
- A token that is not fresh after all (redis-py resent the pipeline after a dropped
  connection, the first send having run): the open finds its record and writes nothing, what
  the SETs wrote is deleted if it still holds what they wrote, and every claim goes to the
  script, which answers as for a token claimed under before (a claim the first send wrote is
  MINE). A token a caller used before is a mistake this only mends once the call returns:
  under a done token, the SETs' claims read as done until they are deleted, and stay if the
  deletion fails. ``fresh`` is for a token drawn for this pass (a consumer's, 64 random bits).

A pass whose round trip fails midway (Redis out of memory between two SETs) may leave claims
under its token, with their records, as a consumer that stopped mid-batch does: the consumer
re-reads the batch, and its next pass finds them MINE.

On Redis Cluster a pass always goes to the script: a plain command redirected during a slot
migration may run after the claims behind it, and the record must come first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from eoguard.store.bindings.dedup import DedupOpen
from eoguard.store.client import wrap_redis_error
from eoguard.store.dedup_types import Claim, ClaimReport, ClaimResult
from eoguard.store.scripts import Call, Command, Prepared

if TYPE_CHECKING:
    from eoguard.store.dedup import DedupStore

__all__ = ["prepare_fresh_claim"]

_NEW, _EXPIRED = ClaimResult.NEW, ClaimResult.EXPIRED
_TIME = Command("TIME", ())


def _claimed_by(token: str) -> str:
    """A claim key's value under ``token`` without its position (lua/lib/dedup_values.lua)."""
    return f"c|{token}|"


def prepare_fresh_claim(store: DedupStore, token: str, claims: Sequence[Claim]
                        ) -> Prepared[ClaimReport]:
    """The claims of the fresh pass ``token``: plain SETs for those within the bound of the
    clock last read, the script (in a second round trip) for the rest."""
    clock = store.redis_now_ms
    if clock is None:  # no clock read yet: the script, and a TIME for the next pass
        scripted = store.prepare_claim(token, claims)
        calls = len(scripted.calls)

        def first(replies: list[Any]) -> ClaimReport:
            seconds, micros = replies[calls]
            store.redis_now_ms = int(seconds) * 1000 + int(micros) // 1000
            return scripted.parse(replies[:calls])

        return Prepared([*scripted.calls, _TIME], first)
    grace = store.grace_ms
    bound_ms = store.keys.max_ttl_ms + grace
    latest_at = clock + bound_ms  # a PXAT past this goes to the script, which clamps it
    value = _claimed_by(token)
    sent: list[int] = []
    unsent: list[int] = []
    commands: list[Call] = []
    latest: dict[int, int] = {}
    for i, claim in enumerate(claims):
        pxat = claim[2] + grace
        if pxat > latest_at or claim[2] <= clock:  # past the bound, or expired already: the
            unsent.append(i)                      # script judges it (a SET's PXAT must be > 0)
            continue
        shard = claim[3] if claim[3] >= 0 else store.keys.shard_of(claim[0])
        sent.append(i)
        commands.append(Command("SET", (claim[4] or store.key(claim[0]),
                                        value + claim[1], "NX", "GET", "PXAT", pxat)))
        if pxat > latest.get(shard, -1):
            latest[shard] = pxat
    if not sent:
        return store.prepare_claim(token, claims)
    records = store.batch_keys(token, list(latest))  # in shard order
    opener = DedupOpen.build(records=[record for _, record in records], lease_ms=store.lease_ms,
                             bound_ms=bound_ms,
                             latest_pxat=[latest[shard] for shard, _ in records])

    def parse(replies: list[Any]) -> ClaimReport:
        return _landed(store, token, claims, replies, sent=sent, unsent=unsent)

    return Prepared([opener, *commands], parse)


def _landed(store: DedupStore, token: str, claims: Sequence[Claim], replies: list[Any], *,
            sent: list[int], unsent: list[int]) -> ClaimReport:
    """The pass's report from the replies of its open and its SETs (``sent``: the claims they
    carried, in order; ``unsent``: those left to the script), with the second round trip made
    when one is needed."""
    opened = DedupOpen.parse(replies[0])
    store.redis_now_ms = now = opened.now_ms
    grace = store.grace_ms
    limit = now + store.keys.max_ttl_ms + grace
    results: list[Any] = [None] * len(claims)
    again = list(unsent)  # claimed by the script
    written: list[int] = []  # claims the SETs wrote
    for i, found in zip(sent, replies[1:], strict=True):
        if found is None:
            written.append(i)
        else:
            again.append(i)
    if not opened.opened:  # the token was claimed under before: every claim by the script
        return _not_fresh(store, token, claims, written)
    released: list[int] = []  # written, but not to keep as the SET left them
    for i in written:
        expires_at = claims[i][2]
        if expires_at <= now:  # expired by Redis's clock: EXPIRED, no key left
            released.append(i)
            results[i] = _EXPIRED
        elif expires_at + grace > limit:  # past the bound by Redis's clock (it stepped back
            released.append(i)            # since the clock was read): claimed again by the
            again.append(i)               # script, which clamps it
        else:
            results[i] = _NEW
    if not (again or released):
        return ClaimReport(results, {})
    return _second_pass(store, token, claims, results=results, again=sorted(again),
                        released=released)


def _second_pass(store: DedupStore, token: str, claims: Sequence[Claim], *,
                 results: list[Any], again: list[int], released: list[int]) -> ClaimReport:
    """One more round trip: the claims the SETs wrote and the pass does not keep released
    (deleted: their record is this pass's, open), then the claims ``again`` claimed by the
    script under the same token."""
    prepared: list[Prepared[Any]] = []
    if released:
        prepared.append(store.prepare_release(token, [claims[i] for i in released]))
    if again:
        prepared.append(store.prepare_claim(token, [claims[i] for i in again]))
    replies = store.run(prepared, "claiming a batch")
    lease_ms: dict[int, int] = {}
    holders: dict[int, str] = {}
    if again:
        report: ClaimReport = replies[-1]
        for at, i in enumerate(again):
            results[i] = report.results[at]
            if at in report.lease_ms:
                lease_ms[i] = report.lease_ms[at]
            if at in report.holders:
                holders[i] = report.holders[at]
    return ClaimReport(results, lease_ms, holders)


def _not_fresh(store: DedupStore, token: str, claims: Sequence[Claim], written: list[int]
               ) -> ClaimReport:
    """The open found a record of the token: its pipeline was sent again (redis-py resends
    one after a dropped connection, and the first send had run), or a caller used the token
    before. What the SETs wrote in this send is deleted if it still holds what they wrote
    (compared and deleted in one transaction: a release keeps the keys of a done batch, where
    they would mark messages nobody handled); then every claim goes to the script, which
    answers as for a token claimed under before (a claim the first send wrote is MINE; under
    a done token, STALE)."""
    value = _claimed_by(token)
    for i in written:
        claim = claims[i]
        _delete_if(store, claim[4] or store.key(claim[0]), value + claim[1])
    report: ClaimReport = store.run([store.prepare_claim(token, claims)], "claiming a batch")[0]
    return report


def _delete_if(store: DedupStore, key: str, expected: str) -> None:
    """Delete ``key`` if it holds ``expected`` (WATCH, GET, MULTI/DEL/EXEC, retried while
    another client writes it meanwhile)."""
    def delete(pipe: Any) -> None:
        held = pipe.get(key)
        if held is not None and (held.decode() if isinstance(held, bytes) else held) == expected:
            pipe.multi()
            pipe.delete(key)

    client: Any = store.client  # a single node's: the fresh path runs nowhere else
    try:
        client.transaction(delete, key)
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "deleting a claim the pass does not keep") from exc
