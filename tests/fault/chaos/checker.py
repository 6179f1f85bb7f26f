"""After the drain: docs/design.md §10 checked from the effects, ledgers, topics and Redis.

``Counts`` is what one run did (its summary line); ``violations()`` lists every invariant it
broke. Lost = guaranteed, not handled in a scope, and unexpired when the drain ended. A
guaranteed message that expired unhandled is not excused: a short-TTL one (4 s) is counted
and reported (a fault delayed it past its expiry, as designed); a long-TTL one (180 s) means a
partition stalled that long, a violation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from eoguard.codec.rules import InputLimits
from eoguard.demo import observe
from eoguard.demo.inject import Injected
from eoguard.store.keys import KeySpace
from eoguard.store.outbox_admin import sweep_index
from tests.fault.chaos.clock import Skew
from tests.fault.chaos.workload import AHEAD_TTL_S, LONG_TTL_S, SCOPES, SHORT_TTL_S


@dataclass
class Counts:
    """What one run sent, handled, expired, dead-lettered, lost and duplicated."""

    guaranteed: int = 0
    short: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    handled: dict[str, int] = field(default_factory=dict)
    expired_short: dict[str, int] = field(default_factory=dict)
    expired_long: dict[str, set[str]] = field(default_factory=dict)
    expired_skew: dict[str, int] = field(default_factory=dict)  # as a skewed clock may
    lost: dict[str, set[str]] = field(default_factory=dict)
    duplicated: dict[str, dict[str, int]] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    expired_injected_handled: set[str] = field(default_factory=set)
    malformed: int = 0
    malformed_missing: set[tuple[int, int]] = field(default_factory=set)
    dead_lettered: int = 0
    duplicates_sent: int = 0
    spark: dict[str, int] = field(default_factory=dict)  # empty: no Spark scope in the run
    spark_violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        per = " ".join(f"{s}:handled={self.handled.get(s, 0)},expired={self.expired_short.get(s, 0)}"
                       f"+{len(self.expired_long.get(s, ()))}+skew{self.expired_skew.get(s, 0)},"
                       f"lost={len(self.lost.get(s, ()))},"
                       f"dup={len(self.duplicated.get(s, {}))},late={self.late.get(s, 0)}"
                       for s in SCOPES)
        refused = ",".join(f"{k}={v}" for k, v in sorted(self.refused.items())) or "0"
        spark = ",".join(f"{k}={v}" for k, v in self.spark.items()) or "off"
        return (f"guaranteed={self.guaranteed} short_ttl={self.short} refused={refused} "
                f"duplicates_sent={self.duplicates_sent} {per} spark:{spark} "
                f"malformed={self.malformed} dead_lettered={self.dead_lettered}")

    def violations(self) -> list[str]:
        out = []
        for scope in SCOPES:
            if self.lost.get(scope):
                out.append(f"invariant 1: {len(self.lost[scope])} guaranteed unexpired messages not "
                           f"handled in {scope}, e.g. {sorted(self.lost[scope])[:3]}")
            if self.duplicated.get(scope):
                out.append(f"invariant 2: handled more than once in {scope}: "
                           f"{list(self.duplicated[scope].items())[:3]}")
            if self.late.get(scope):
                out.append(f"invariant 3: {self.late[scope]} handlings after expires_at in {scope}")
            if self.expired_long.get(scope):
                out.append(f"stall: {len(self.expired_long[scope])} {LONG_TTL_S:.0f} s TTL messages "
                           f"expired unhandled in {scope}, e.g. {sorted(self.expired_long[scope])[:3]}")
        if self.expired_injected_handled:
            out.append(f"invariant 3: expired envelopes handled: "
                       f"{sorted(self.expired_injected_handled)[:3]}")
        if self.malformed_missing:
            out.append(f"invariant 4: malformed records not dead-lettered at "
                       f"{sorted(self.malformed_missing)}")
        return out + self.spark_violations


def count(client: redis.Redis, keys: KeySpace, ledgers: list[observe.LedgerView], injected: Injected,
          dead: dict[tuple[int, int], str], drained_ms: int, skews: Sequence[Skew] = ()) -> Counts:
    """Invariants 1-4 from the producers' ledgers, the scopes' effects and the dead letters,
    with what docs/design.md §5 (Clocks) allows a skewed clock (:func:`skewed_out`)."""
    guaranteed: set[str] = set()
    expires: dict[str, int] = {}
    c = Counts()
    for ledger in ledgers:
        guaranteed |= ledger.guaranteed
        expires.update(ledger.expires_ms)
        c.duplicates_sent += len(ledger.duplicated)
        for error, n in ledger.refused.items():
            c.refused[error] = c.refused.get(error, 0) + n
    short_ms = int(SHORT_TTL_S * 1000) + 1000
    short = {m for m in guaranteed if expires[m] - _created_ms(m) <= short_ms}
    c.guaranteed, c.short = len(guaranteed), len(short)
    for scope in SCOPES:
        handled = observe.effect_counts(client, keys, scope)
        c.handled[scope] = len(handled.keys() & guaranteed)
        missing = guaranteed - handled.keys()
        expired = {m for m in missing if expires[m] <= drained_ms}
        skewed = skewed_out(skews, scope, missing - short, expires, drained_ms)
        c.expired_short[scope] = len(expired & short)
        c.expired_skew[scope] = len(skewed)
        c.expired_long[scope] = expired - short - skewed
        c.lost[scope] = missing - expired - skewed
        c.duplicated[scope] = {m: n for m, n in handled.items() if n != 1}
        c.late[scope] = observe.late_count(client, keys, scope)
        c.expired_injected_handled |= set(injected.expired_ids) & handled.keys()
    c.malformed = len(injected.malformed)
    c.malformed_missing = set(injected.malformed) - dead.keys()
    c.dead_lettered = len(dead)
    return c


def skewed_out(skews: Sequence[Skew], scope: str, unhandled: set[str], expires: dict[str, int],
               drained_ms: int) -> set[str]:
    """The long-TTL messages of ``unhandled`` (in ``scope``) a skewed clock may leave unhandled
    (docs/design.md §5, Clocks): those a consumer of the scope running Δ ahead saw expired
    (``expires_at`` - Δ before it stopped), and the expired ones of a producer Δ behind (they
    lived Δ less: no stall). An unexpired message of that producer stays a loss."""
    out: set[str] = set()
    for skew in skews:
        if skew.role == "consumer" and skew.scope == scope and skew.skew_ms > 0:
            out |= {m for m in unhandled if expires[m] - skew.skew_ms <= skew.to_ms}
        elif skew.role == "producer" and skew.skew_ms < 0:
            out |= {m for m in unhandled & skew.ids if expires[m] <= drained_ms}
    return out


def spark(c: Counts, ledgers: list[observe.LedgerView], injected: Injected,
          rows: Counter[str], ended_ms: int, consumer: Counter[str] | None = None) -> None:
    """The Spark scope: each id once across all batch folders (and the handlings of the
    GuardedConsumer sharing the scope, if any: then the job ran through the window); every
    guaranteed message still unexpired when the job ended is there (it was unexpired whenever
    it was read); no expired envelope. With the job running through the window, a long-TTL
    message that expired unhandled means the scope stalled that long, as for the consumers."""
    guaranteed: set[str] = set()
    expires: dict[str, int] = {}
    for ledger in ledgers:
        guaranteed |= ledger.guaranteed
        expires.update(ledger.expires_ms)
    handled = Counter(consumer or {})
    both = rows + handled
    live = {m for m in guaranteed if expires[m] > ended_ms}
    lost = live - both.keys()
    twice = {m: (rows[m], handled[m]) for m, n in both.items() if n != 1}
    expired_out = set(injected.expired_ids) & both.keys()
    short_ms = int(SHORT_TTL_S * 1000) + 1000
    expired = guaranteed - both.keys() - live
    stalled = {m for m in expired if expires[m] - _created_ms(m) > short_ms}
    c.spark = {"rows": sum(rows.values()), **({"consumer": sum(handled.values())} if consumer
                                               is not None else {}),
               "unexpired_at_end": len(live), "expired": len(expired), "lost": len(lost),
               "dup": len(twice)}
    where = "the Spark job's output" + (" or the scope's consumer" if consumer is not None else "")
    if lost:
        c.spark_violations.append(f"invariant 1: {len(lost)} guaranteed messages unexpired when "
                                  f"the Spark job ended are not in {where}: {sorted(lost)[:3]}")
    if twice:
        c.spark_violations.append(f"invariant 2: ids more than once in {where} (rows, "
                                  f"handlings): {list(twice.items())[:3]}")
    if expired_out:
        c.spark_violations.append(f"invariant 3: expired envelopes in {where}: "
                                  f"{sorted(expired_out)[:3]}")
    if consumer is not None and stalled:
        c.spark_violations.append(f"stall: {len(stalled)} {LONG_TTL_S:.0f} s TTL messages expired "
                                  f"before {where} had them, e.g. {sorted(stalled)[:3]}")


@dataclass
class Lifetimes:
    """What the invariant 6 check read: keys per kind, messages, the closest any value came to
    its bound (ms; negative: past it), and every key or message past its bound."""

    max_ttl_ms: int
    grace_ms: int
    allowance_ms: int
    kinds: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    clamped: int = 0  # long-TTL messages of a producer running ahead, their expiry cut
    closest_ms: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def near(self, check: str, bound: int, value: int) -> int:
        """Note how close ``value`` came to ``bound`` under ``check``; the margin."""
        margin = bound - value
        self.closest_ms[check] = min(margin, self.closest_ms.get(check, margin))
        return margin

    def line(self) -> str:
        kinds = ",".join(f"{k}={n}" for k, n in sorted(self.kinds.items()))
        closest = ",".join(f"{k}={v}" for k, v in sorted(self.closest_ms.items()))
        return (f"invariant 6: max_ttl={self.max_ttl_ms}ms grace={self.grace_ms}ms "
                f"allowance={self.allowance_ms}ms keys[{kinds}] messages={self.messages} "
                f"(clamped ahead={self.clamped}) closest_ms[{closest}] "
                f"violations={len(self.violations)}")


def key_lifetimes(client: redis.Redis, keys: KeySpace, ledgers: list[observe.LedgerView],
                  skews: Sequence[Skew], grace_ms: int) -> Lifetimes:
    """Invariant 6 at the end of a run: every key of the run's prefix (handler effects aside)
    read with PTTL and held to its bound (:func:`judge_lifetimes`)."""
    names = [k for k in client.scan_iter(match=keys.pattern(), count=1000) if b":fx:" not in k]
    seconds, micros = client.time()
    read_ms = int(seconds) * 1000 + int(micros) // 1000  # before any PTTL: expiries underrated
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.pttl(name)
    ttls = [(name.decode(), int(ttl)) for name, ttl in zip(names, pipe.execute(), strict=True)]
    expires: dict[str, int] = {}
    for ledger in ledgers:
        expires.update(ledger.expires_ms)
    ahead = {m: s.skew_ms for s in skews if s.role == "producer" for m in s.ids}
    return judge_lifetimes(ttls, read_ms, keys.max_ttl_ms, grace_ms, expires, ahead)


def judge_lifetimes(ttls: Sequence[tuple[str, int]], read_ms: int, max_ttl_ms: int, grace_ms: int,
                    expires: dict[str, int], skew_of: dict[str, int]) -> Lifetimes:
    """Invariant 6 as docs/design.md §4 and §5 (Clocks) state it, with the clock-skew allowance:

    - each message's ``expires_at`` at most max_ttl + allowance after it was sent by the real
      clock (its UUIDv7 time less its producer's skew): a producer ahead clamps to Redis's now
      plus max_ttl, from a lead it never overstates;
    - each key's PTTL at most max_ttl (outbox records and indexes: no grace) or max_ttl + grace
      (claims, batch records, re-owned and passed hashes, liveness sets); no TTL only on the
      layout record;
    - an outbox record expiring by its message's ``expires_at``, a claim by ``expires_at`` +
      grace, and every other key of a message by the run's last ``expires_at`` + grace.

    ``ttls`` are (key, PTTL) read after ``read_ms`` (Redis's clock), so ``read_ms + PTTL`` never
    overstates an expiry."""
    allowance_ms = InputLimits().within_grace(grace_ms).clock_skew_ms
    out = Lifetimes(max_ttl_ms, grace_ms, allowance_ms)
    for m, at in expires.items():
        sent_ms = _created_ms(m) - skew_of.get(m, 0)
        out.messages += 1
        asked_ms = at - _created_ms(m)  # by its producer's clock
        out.clamped += (skew_of.get(m, 0) > 0 and (SHORT_TTL_S + 1) * 1000 < asked_ms
                        < AHEAD_TTL_S * 1000 - 200)
        if out.near("expires_at-sent", max_ttl_ms + allowance_ms, at - sent_ms) < 0:
            out.violations.append(f"invariant 6: message {m} expires {at - sent_ms} ms after it "
                                  f"was sent, past max_ttl plus the allowance")
    # A message sent just before its producer's SIGKILL has no expiry in the ledger: the one
    # before it (tens of ms earlier) bounds it, with a second to spare.
    last_ms = max(expires.values(), default=read_ms) + 1000
    for name, ttl in ttls:
        kind = _kind(name)
        out.kinds[kind] += 1
        if ttl == -2:  # expired between SCAN and PTTL
            continue
        if ttl == -1:
            if kind != "layout":
                out.violations.append(f"invariant 6: {name} has no TTL")
            continue
        bound = max_ttl_ms if kind in ("record", "index") else max_ttl_ms + grace_ms
        if out.near("pttl", bound, ttl) < 0:
            out.violations.append(f"invariant 6: {name} has PTTL {ttl} ms, past its bound "
                                  f"{bound} ms")
        at = read_ms + ttl
        message = expires.get(name.rsplit(":", 1)[1])
        if kind == "record" and message is not None:
            past = -out.near("record-expires_at", message, at)
        elif kind == "claim" and message is not None:
            past = -out.near("claim-expires_at+grace", message + grace_ms, at)
        elif kind not in ("index", "layout", "live"):
            past = -out.near("last-expires_at+grace", last_ms + grace_ms, at)
        else:
            continue
        if past > 0:
            out.violations.append(f"invariant 6: {name} expires {past} ms past its message's "
                                  f"bound")
    return out


_KINDS = ((":r:", "record"), (":dc:", "claim"), (":db:", "batch"), (":dr:", "reowned"),
          (":dp:", "passed"), (":live:", "live"), (":meta:", "layout"))


def _kind(name: str) -> str:
    if name.endswith(":idx"):
        return "index"
    return next((kind for infix, kind in _KINDS if infix in name), "other")


def leftovers(client: redis.Redis, keys: KeySpace, expired: set[str] | None = None) -> list[str]:
    """Invariant 5: no outbox record, claim or index entry of a message past its expiry plus
    grace (``expired``: those messages alone; None: every message of the run, and no batch
    record or re-owned hash either)."""
    sweep_index(client, keys, dry_run=False)
    patterns = [keys.outbox_record_pattern(), keys.dedup_pattern()]
    if expired is None:
        patterns += [keys.dedup_batch_pattern(), keys.dedup_reowned_pattern(),
                     keys.dedup_passed_pattern()]
    found = [k.decode() for p in patterns for k in client.scan_iter(match=p, count=1000)]
    entries = [m.decode() for s in range(keys.shards) for m in client.zrange(keys.outbox_index(s), 0, -1)]
    if expired is not None:
        found = [k for k in found if k.rsplit(":", 1)[1] in expired]
        entries = [m for m in entries if m in expired]
    out = [f"invariant 5: {len(found)} keys left after expiry plus grace, e.g. {found[:3]}"] if found else []
    if entries:
        out.append(f"invariant 5: {len(entries)} outbox index entries left after expiry plus grace")
    return out


def _created_ms(message_id: str) -> int:
    """A UUIDv7's first 48 bits are its creation time in ms."""
    return int(message_id.replace("-", "")[:12], 16)
