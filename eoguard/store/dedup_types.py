"""Value types of the dedup store (v2): positions, claims, the scripts' result codes, and
claim keys and batch records as the CLI shows them."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from eoguard.store.client import out_of_memory
from eoguard.store.keys import KeySpace

__all__ = [
    "BatchRecord",
    "BatchState",
    "Claim",
    "ClaimOutcome",
    "ClaimReport",
    "ClaimResult",
    "DedupEntry",
    "DedupState",
    "DoneOutcome",
    "DoneReport",
    "DoneResult",
    "Effect",
    "IdState",
    "Position",
    "ReleaseResult",
    "RenewResult",
    "parse_position",
    "position",
]


class ClaimResult(enum.Enum):
    """Outcome of claiming one message; the values are the codes ``dedup_claim.lua`` returns."""

    NEW = 0  # absent, or held elsewhere under a lapsed lease (taken over): ours now
    MINE = 1  # held at this same position by a batch not done: re-owned under our token
    DONE_HERE = 2  # held at this same position by a done batch: handled already, by this reader
    DUPLICATE = 3  # done at another position (or PARTIAL there)
    BUSY = 4  # held at another position under a live lease: wait
    EXPIRED = 5  # past expires_at by the server clock: nothing written
    PARTIAL = 6  # PARTIAL at this same position: dead-letter it, never handle it
    STALE = 7  # the caller's token is done: nothing may be claimed under it
    PASSED = 8  # an attempt of the caller's token gave this position up as BUSY for good

    @property
    def should_handle(self) -> bool:
        """Whether the claimant now holds the claim and runs the handler."""
        return self is ClaimResult.NEW or self is ClaimResult.MINE


class DoneResult(enum.Enum):
    """Outcome of settling one claim of a batch; the codes of ``dedup_done.lua``."""

    OK = 0
    NOT_OWNED = 1  # the key names another token (re-owned, taken over): left alone
    ALREADY_DONE = 2  # the batch was done before, or the key is PARTIAL: nothing applied
    EFFECT_ERROR = 3  # effects refused, nothing applied, the claim deleted: claim anew
    ABSENT = 4  # the claim vanished (TTL, forget, failover): nothing applied, claim again
    # An effect failed after the check passed, midway: what came before it stays applied (Redis
    # cannot roll back), so the key is marked PARTIAL (done for every reader), never retried.
    PARTIAL = 5
    RELEASED = 6  # not handled (failed, dropped) and still ours: the claim deleted


class RenewResult(enum.Enum):
    """Outcome of renewing (or giving back) one batch record; the codes of ``dedup_renew.lua``."""

    ABSENT = 0  # no record (its claim call not run yet, or gone): nothing written
    RENEWED = 1
    DONE = 2


class ReleaseResult(enum.Enum):
    """Outcome of releasing one claim of a batch; the codes of ``dedup_release.lua``."""

    OK = 0
    NOT_OWNED = 1
    ALREADY_DONE = 2


class DedupState(enum.Enum):
    """What a claim key holds (the first character of its value)."""

    CLAIMED = "c"  # its state is its batch record's
    PARTIAL = "p"  # done for every reader, its Redis effects partially applied


class BatchState(enum.Enum):
    """What a batch record holds (the first character of its value)."""

    OPEN = "o"
    DONE = "d"


class IdState(enum.Enum):
    """A message id's state in a scope, derived by the v2 rules (docs/design.md §4)."""

    NEW = "new"  # no claim key
    DONE = "done"  # its batch is done
    PARTIAL = "partial"  # done, effects partially applied
    IN_PROGRESS = "in-progress"  # its batch is open with a live lease
    FREE = "free"  # its batch's lease lapsed, or the record is gone: free to take over


class Position(NamedTuple):
    """A record as one reader sees it: the claim's owner, with the token of its batch."""

    reader: str
    topic: str
    partition: int
    offset: int


def position(reader: str, topic: str, partition: int, offset: int) -> str:
    """A claim's position, encoded unambiguously: reader and topic are length-prefixed, so
    they may hold any character and two positions are equal exactly when their strings are.

    ``reader`` names who reads the topic: a consumer group id, or a Spark query. A replay by
    the same reader (restart before commit, a retried micro-batch) finds its own position and
    re-owns the claim; two readers of one scope are two positions, so only one handles it.
    """
    return f"{len(reader)}:{reader}|{len(topic)}:{topic}|{partition}|{offset}"


def parse_position(text: str) -> Position:
    """The inverse of :func:`position`; raises ValueError on text it did not write."""
    fields: list[str] = []
    rest = text
    for _ in range(2):
        size, sep, rest = rest.partition(":")
        if not sep or not size.isdigit() or rest[int(size):int(size) + 1] != "|":
            raise ValueError(f"not a dedup position: {text!r}")
        fields.append(rest[:int(size)])
        rest = rest[int(size) + 1:]
    partition, sep, offset = rest.partition("|")
    if not sep:
        raise ValueError(f"not a dedup position: {text!r}")
    return Position(fields[0], fields[1], int(partition), int(offset))


class Claim(NamedTuple):
    """One message to claim: its id, its position and its expiry (a tuple: hot path).

    ``shard`` and ``key`` locate its claim key; :meth:`DedupStore.new_claim` fills them once
    per message, otherwise the store computes them at every call.
    """

    message_id: str
    position: str
    expires_at_ms: int
    shard: int = -1
    key: str = ""


class ClaimOutcome(NamedTuple):
    """The claim and its result; ``lease_ms`` is the holder's lease left when BUSY."""

    claim: Claim
    result: ClaimResult
    lease_ms: int


class ClaimReport(NamedTuple):
    """A batch's claim results in claim order, without a tuple per message (hot path)."""

    results: list[ClaimResult]
    lease_ms: dict[int, int]  # per BUSY claim (by index): the holder's lease left
    holders: dict[int, str] = {}  # per BUSY claim (by index): the token of the holding batch

    def outcomes(self, claims: Sequence[Claim]) -> list[ClaimOutcome]:
        return [ClaimOutcome(claim, result, self.lease_ms.get(i, 0))
                for i, (claim, result) in enumerate(zip(claims, self.results, strict=True))]


class DoneReport(NamedTuple):
    """A batch's done results in claim order, without a tuple per message (hot path)."""

    results: list[DoneResult]
    details: dict[int, str]  # per EFFECT_ERROR / PARTIAL (by index): why effects failed

    def refused_for_memory(self, i: int) -> bool:
        """Whether the ``i``-th claim's effects were refused because Redis is full (OOM under
        noeviction): a store outage, not the message's fault. Judged by the error Redis gave,
        the text after the last ``) failed: `` of the reason ``lua/lib/effects.lua`` writes
        (``<command> <key> (command c of n) failed: <error>; ...``), never by the key or any
        other text that comes from the message."""
        _, failed, error = self.details.get(i, "").rpartition(") failed: ")
        return bool(failed) and out_of_memory(error)  # the check's refusals are no writes

    def outcomes(self, claims: Sequence[Claim]) -> list[DoneOutcome]:
        return [DoneOutcome(claim, result, self.details.get(i, ""))
                for i, (claim, result) in enumerate(zip(claims, self.results, strict=True))]


@dataclass(frozen=True, slots=True)
class Effect:
    """One single-key Redis write applied atomically with the done mark."""

    command: str
    key: str
    args: tuple[str | bytes | int | float, ...] = ()


class DoneOutcome(NamedTuple):
    """The claim, how it was settled, and the reason when an effect was refused."""

    claim: Claim
    result: DoneResult
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch record as the CLI shows it: open with its lease deadline, or done."""

    key: str
    token: str
    state: BatchState
    at_ms: int  # the lease deadline when open, the done time when done
    expire_at_ms: int  # PEXPIRETIME; -1 = no TTL

    @classmethod
    def parse(cls, key: str, value: str, expire_at_ms: int) -> BatchRecord:
        state, _, at = value.partition("|")
        return cls(key=key, token=key.rsplit(":", 1)[-1], state=BatchState(state),
                   at_ms=int(at), expire_at_ms=expire_at_ms)


@dataclass(frozen=True, slots=True)
class DedupEntry:
    """A claim key as the CLI shows it, with its batch record (None when that is gone)."""

    message_id: str
    key: str
    state: DedupState
    token: str
    position: str
    expire_at_ms: int  # PEXPIRETIME: expires_at + grace; -1 = no TTL
    batch: BatchRecord | None

    @classmethod
    def parse(cls, key: str, value: str, expire_at_ms: int,
              batch: BatchRecord | None) -> DedupEntry:
        state, token, where = value.split("|", 2)
        return cls(message_id=key.rsplit(":", 1)[-1], key=key, state=DedupState(state),
                   token=token, position=where, expire_at_ms=expire_at_ms, batch=batch)

    @property
    def scope(self) -> str:
        """The consumer scope, from the key's hash tag ``{<scope>/<shard>}``."""
        return KeySpace.scope_of(self.key)

    def id_state(self, now_ms: int) -> IdState:
        """The id's state by the v2 rules, judged at ``now_ms``."""
        if self.state is DedupState.PARTIAL:
            return IdState.PARTIAL
        batch = self.batch
        if batch is None:
            return IdState.FREE
        if batch.state is BatchState.DONE:
            return IdState.DONE
        return IdState.IN_PROGRESS if batch.at_ms > now_ms else IdState.FREE
