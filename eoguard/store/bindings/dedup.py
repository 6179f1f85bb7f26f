"""Bindings of the dedup scripts (``lua/dedup_*.lua``): calls built from typed shard groups,
replies read into the reports :class:`eoguard.store.dedup.DedupStore` returns.

The consumer and the Spark job send claims and done marks per batch of 500-2000 claims, so the
per-claim work stays one loop that extends a flat argv with a tuple and one that maps a digit
to a result, with no object per claim. Those builds write each row's fields inline, in the order
of its row type (``ClaimHead``, ``ClaimArgs``, ``DoneMessage``...: the declarations the contract
is made of); tests/unit/test_bindings.py reads every field back by name, pinning them to it.
A reply's codes are ASCII digits: code n is member n of the result enum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from eoguard.store.bindings.layout import Binding, Contract, Each, Fixed, Layout, Rest, Returns, Row, Run
from eoguard.store.dedup_types import (
    Claim,
    ClaimReport,
    ClaimResult,
    DoneReport,
    DoneResult,
    Effect,
    ReleaseResult,
    RenewResult,
)
from eoguard.store.scripts import Command, ScriptArg, ScriptCall, lua_script

__all__ = [
    "ClaimGroup",
    "DedupClaim",
    "DedupDone",
    "DedupOpen",
    "DedupRelease",
    "DedupRenew",
    "DoneGroup",
    "ReleaseGroup",
]

_CLAIM = tuple(ClaimResult)  # by code: enum lookups by value are slow on the hot path
_DONE = tuple(DoneResult)
_RELEASE = tuple(ReleaseResult)
_RENEW = tuple(RenewResult)
_BUSY = 48 + ClaimResult.BUSY.value  # as the script writes it: an ASCII digit
_WITH_REASON = (48 + DoneResult.EFFECT_ERROR.value, 48 + DoneResult.PARTIAL.value)
_OK = DoneResult.OK


# dedup_claim -------------------------------------------------------------------------------
class ClaimHead(NamedTuple):
    """The arguments a ``dedup_claim`` call opens with (written inline by the build)."""

    token: str
    lease_ms: int
    grace_ms: int
    max_ttl_ms: int
    groups: int
    give_up_busy: int  # 1: a claim left BUSY is given up for good under the token


class ClaimGroupArgs(NamedTuple):
    """A group's arguments, one row per group (written inline)."""

    record_prefix: str
    reowned_prefix: str
    claims: int


class ClaimArgs(NamedTuple):
    """A claim's arguments (written inline by :meth:`DedupClaim.build`)."""

    position: str
    pxat: int  # expires_at + grace: the claim key's PXAT


class ClaimReply(NamedTuple):
    """A ``dedup_claim`` call's reply."""

    codes: bytes
    busy: list[Any]


class BusyItems(NamedTuple):
    """What ``busy`` lists per BUSY claim (read inline by :meth:`DedupClaim.parse`)."""

    lease_ms: int
    holder: bytes


class ClaimGroup(NamedTuple):
    """One shard's claims in a ``dedup_claim`` call."""

    record: str  # the batch record of (scope, token, shard)
    passed: str  # its passed hash
    record_prefix: str  # the batch record of any token on this scope and shard: this + token
    reowned_prefix: str  # the re-owned hash of any token: this + token
    members: list[int]  # the claims' indexes in the batch, in the order of claim_keys
    claim_keys: list[str]


class DedupClaim(Binding):
    """``dedup_claim``: claim a batch's messages under its token, one call per group of shards."""

    contract = Contract(
        "dedup_claim",
        keys=Layout(Run("record", "g"), Run("passed", "g"), Run("claim_key", "n"), Rest("asked")),
        argv=Layout(Fixed(ClaimHead._fields), Each(ClaimGroupArgs._fields, "g", "j"),
                    Each(ClaimArgs._fields, "n", "i")),
        returns=Returns(ClaimReply._fields, rows=(Row("busy", BusyItems._fields),),
                        codes=ClaimResult, asks=True))

    @classmethod
    def build(cls, *, token: str, lease_ms: int, grace_ms: int, max_ttl_ms: int,
              give_up_busy: bool, groups: Sequence[ClaimGroup], claims: Sequence[Claim]
              ) -> ScriptCall:
        keys = [group.record for group in groups]
        keys += [group.passed for group in groups]
        argv: list[ScriptArg] = [token, lease_ms, grace_ms, max_ttl_ms, len(groups),
                                 1 if give_up_busy else 0]  # ClaimHead
        for group in groups:  # ClaimGroupArgs
            argv += (group.record_prefix, group.reowned_prefix, len(group.members))
        for group in groups:
            keys += group.claim_keys
            for i in group.members:
                claim = claims[i]
                argv += (claim[1], claim[2] + grace_ms)  # ClaimArgs: position, pxat
        return cls.call(keys, argv)

    @staticmethod
    def parse(replies: Sequence[Any], order: Sequence[int], size: int) -> ClaimReport:
        """The report of a batch of ``size`` claims from its calls' replies; ``order`` holds
        the claims' indexes in the order the calls list their claim keys."""
        results: list[Any] = [None] * size
        lease_ms: dict[int, int] = {}
        holders: dict[int, str] = {}
        at = 0
        for reply in map(ClaimReply._make, replies):
            codes = reply.codes
            members = order[at:at + len(codes)]
            at += len(codes)
            for i, code in zip(members, codes, strict=True):
                results[i] = _CLAIM[code - 48]
            if reply.busy:
                items = iter(reply.busy)
                for i, code in zip(members, codes, strict=True):
                    if code == _BUSY:  # BusyItems: lease_ms, holder
                        lease_ms[i] = int(next(items))
                        holders[i] = next(items).decode()
        return ClaimReport(results, lease_ms, holders)


# dedup_done --------------------------------------------------------------------------------
class DoneHead(NamedTuple):
    """The arguments a ``dedup_done`` call opens with (written inline)."""

    token: str
    groups: int
    claims: int  # claim keys passed: 0 when simple


class DoneTail(NamedTuple):
    """The arguments after the per-group runs (written inline)."""

    bound_ms: int  # max_ttl + grace
    simple: int  # 1: every message handled, none with effects; no claim key passed


class DoneMessage(NamedTuple):
    """A message's row when the pass is not simple (written inline)."""

    position: str
    handled: int
    commands: int


class EffectCommand(NamedTuple):
    """One effect command after its message's row (written inline); ``args`` take the rest."""

    name: str
    key: int  # the effect key's index in KEYS
    argc: int
    args: tuple[ScriptArg, ...]


class DoneReply(NamedTuple):
    """A ``dedup_done`` call's reply."""

    codes: bytes
    details: list[Any]
    reowned: list[Any]


class ReownedItems(NamedTuple):
    """What ``reowned`` lists per re-owned key not settled OK (read inline)."""

    key: bytes
    code: bytes


class DoneGroup(NamedTuple):
    """One shard's claims in a ``dedup_done`` call."""

    record: str  # the batch record of (scope, token, shard)
    reowned: str  # its re-owned hash
    members: list[int]  # the claims' indexes in the batch, in the order of claim_keys
    claim_keys: list[str]
    latest_pxat: int  # the latest PXAT of its claims; 0: unknown (a lost record stays lost)


class DedupDone(Binding):
    """``dedup_done``: settle a pass's claims and mark its batch records done."""

    contract = Contract(
        "dedup_done",
        keys=Layout(Run("record", "g"), Run("reowned", "g"), Run("claim_key", "n"),
                    Run("effect_key", "e"), Rest("asked")),
        argv=Layout(Fixed(DoneHead._fields), Run("count", "g"), Run("latest_pxat", "g"),
                    Fixed(DoneTail._fields),
                    Rest("messages", rows=(Row("message", DoneMessage._fields),
                                           Row("command", EffectCommand._fields, rest=True)))),
        returns=Returns(DoneReply._fields, rows=(Row("reowned", ReownedItems._fields),),
                        codes=DoneResult, asks=True))

    @classmethod
    def build(cls, *, token: str, groups: Sequence[DoneGroup], bound_ms: int, simple: bool,
              claims: Sequence[Claim] = (), handled: Sequence[bool] | None = None,
              effects: Mapping[str, Sequence[Effect]] | None = None) -> ScriptCall:
        """``simple``: every claim handled, none with effects; the claims are not passed."""
        keys = [group.record for group in groups]
        keys += [group.reowned for group in groups]
        latest = [group.latest_pxat for group in groups]
        if simple:  # the common case: nothing per claim
            return cls.call(keys, [token, len(groups), 0,  # DoneHead
                                   *(0 for _ in groups), *latest, bound_ms, 1])  # DoneTail
        argv: list[ScriptArg] = [
            token, len(groups), sum(len(group.members) for group in groups),  # DoneHead
            *(len(group.members) for group in groups), *latest, bound_ms, 0]  # DoneTail
        for group in groups:
            keys += group.claim_keys
        index: dict[str, int] = {}  # effect key -> its index in KEYS
        for group in groups:
            for i in group.members:
                ok = handled is None or handled[i]
                own = (effects or {}).get(claims[i][0], ()) if ok else ()
                argv += (claims[i][1], 1 if ok else 0, len(own))  # DoneMessage
                for eff in own:
                    if eff.key not in index:
                        keys.append(eff.key)
                        index[eff.key] = len(keys)
                    argv += (eff.command.upper(), index[eff.key], len(eff.args), *eff.args)
        return cls.call(keys, argv)

    @staticmethod
    def parse(replies: Sequence[Any], simple: Sequence[bool], members: Sequence[Sequence[int]],
              size: int, claim_key: Callable[[int], str]) -> DoneReport:
        """The report of a batch of ``size`` claims from its calls' replies: per call, whether
        it was simple and its claims' indexes in key order; ``claim_key(i)`` names claim i's key
        (read only when a simple call lists re-owned keys)."""
        results: list[Any] = [_OK] * size
        details: dict[int, str] = {}
        by_key: dict[bytes, int] | None = None
        for reply, plain, in_call in zip(map(DoneReply._make, replies), simple, members,
                                         strict=True):
            if plain:  # no code per claim: OK, but for the re-owned keys listed
                if reply.reowned:
                    if by_key is None:
                        by_key = {claim_key(i).encode(): i for i in range(size)}
                    items = iter(reply.reowned)  # ReownedItems: key, code
                    for key, code in zip(items, items, strict=True):
                        results[by_key[key]] = _DONE[int(code)]
                continue
            codes = reply.codes
            for i, code in zip(in_call, codes, strict=True):
                results[i] = _DONE[code - 48]
            if reply.details:  # one per EFFECT_ERROR or PARTIAL, in order
                reason = iter(reply.details)
                for i, code in zip(in_call, codes, strict=True):
                    if code in _WITH_REASON:
                        details[i] = next(reason).decode()
        return DoneReport(results, details)


# dedup_release -----------------------------------------------------------------------------
class ReleaseHead(NamedTuple):
    """The arguments a ``dedup_release`` call opens with."""

    token: str
    groups: int


class ReleaseGroup(NamedTuple):
    """One shard's claims in a ``dedup_release`` call."""

    record: str  # the batch record of (scope, token, shard)
    claim_keys: list[str]


class DedupRelease(Binding):
    """``dedup_release``: give back claims of a pass that goes on, if still its own."""

    contract = Contract(
        "dedup_release",
        keys=Layout(Run("record", "g"), Run("claim_key", "n")),
        argv=Layout(Fixed(ReleaseHead._fields), Run("count", "g")),
        returns=Returns(("codes",), listed=False, codes=ReleaseResult))

    @classmethod
    def build(cls, *, token: str, groups: Sequence[ReleaseGroup]) -> ScriptCall:
        keys = [group.record for group in groups]
        for group in groups:
            keys += group.claim_keys
        return cls.call(keys, [*ReleaseHead(token, len(groups)),
                               *(len(group.claim_keys) for group in groups)])

    @staticmethod
    def parse(replies: Sequence[Any], order: Sequence[int], size: int) -> list[ReleaseResult]:
        """The results of ``size`` claims in batch order; ``order`` as for dedup_claim."""
        results: list[Any] = [None] * size
        for i, code in zip(order, b"".join(replies), strict=True):
            results[i] = _RELEASE[code - 48]
        return results


# dedup_open --------------------------------------------------------------------------------
class OpenReply(NamedTuple):
    """A ``dedup_open`` call's reply."""

    now_ms: int
    opened: int  # 1: every record written; 0: one existed (the token is not fresh)


class DedupOpen(Binding):
    """``dedup_open``: a fresh pass's batch records, written before its claims' plain SETs.

    Built as an ``EVAL`` of the source, never ``EVALSHA`` (the script's header says why)."""

    contract = Contract(
        "dedup_open",
        keys=Layout(Run("record", "g")),
        argv=Layout(Fixed(("lease_ms", "bound_ms")), Run("latest_pxat", "g")),
        returns=Returns(OpenReply._fields))

    @classmethod
    def build(cls, *, records: Sequence[str], lease_ms: int, bound_ms: int,
              latest_pxat: Sequence[int]) -> Command:
        return Command("EVAL", (lua_script(cls.contract.script).source, len(records), *records,
                                lease_ms, bound_ms, *latest_pxat))

    @staticmethod
    def parse(reply: Sequence[Any]) -> OpenReply:
        return OpenReply(int(reply[0]), int(reply[1]))


# dedup_renew -------------------------------------------------------------------------------
class DedupRenew(Binding):
    """``dedup_renew``: move the lease of batch records (0: give them back)."""

    contract = Contract(
        "dedup_renew",
        keys=Layout(Run("record", "n")),
        argv=Layout(Fixed(("lease_ms",))),
        returns=Returns(("codes",), listed=False, codes=RenewResult))

    @classmethod
    def build(cls, *, records: Sequence[str], lease_ms: int) -> ScriptCall:
        return cls.call(records, [lease_ms])

    @staticmethod
    def parse(replies: Sequence[Any], batches: Sequence[Sequence[int]], size: int
              ) -> list[RenewResult]:
        """The results of ``size`` records; ``batches`` holds each call's records' indexes."""
        results: list[Any] = [None] * size
        for in_call, codes in zip(batches, replies, strict=True):
            for i, code in zip(in_call, codes, strict=True):
                results[i] = _RENEW[code - 48]
        return results
