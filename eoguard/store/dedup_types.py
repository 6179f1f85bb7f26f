"""Value types of the dedup store: claim and done outcomes, effects, entries as the CLI shows them."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
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
    "ReleaseResult",
    "owner_token",
]


class ClaimResult(enum.Enum):
    """Outcome of claiming one message; the values are the codes ``dedup_claim.lua`` returns."""

    NEW = 0
    MINE = 1
    DONE = 2
    BUSY = 3
    TAKEN_OVER = 4
    EXPIRED = 5
    PARTIAL = 6  # done with partial effects by this same owner: dead-letter it, do not handle
    # Done by this same owner: this very record was handled and marked done, and is read again
    # (its offset commit, or the done mark's reply, was lost). Not a duplicate: a redelivery.
    REDELIVERED = 7

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
    ABSENT = 4  # the claim vanished (TTL, forget, failover): nothing applied, claim again
    # An effect failed after the check passed, midway: what came before it stays applied (Redis
    # cannot roll back), so the key is marked done (fenced) and must never be retried.
    PARTIAL = 5


class ReleaseResult(enum.Enum):
    """Outcome of releasing one claim; the codes of ``dedup_release.lua``."""

    OK = 0
    NOT_OWNED = 1
    ALREADY_DONE = 2


class RenewResult(enum.Enum):
    """Outcome of renewing one claim without claiming it; the codes of ``dedup_renew.lua``."""

    ABSENT = 0  # not claimed yet (its claim not processed), or gone: nothing written
    RENEWED = 1
    DONE = 2
    OTHER_OWNER = 3


class DedupState(enum.Enum):
    """What a dedup key holds."""

    CLAIMED = "c"
    DONE = "d"
    PARTIAL = "p"  # done, its Redis effects partially applied (DoneResult.PARTIAL)


def owner_token(scope: str, reader: str, topic: str, partition: int, offset: int) -> str:
    """The claim owner of a record: its source position as seen by one reader (DESIGN.md §4).

    ``reader`` names who reads the topic: a consumer group id, or a Spark query. A replay by
    the same reader (restart before commit, a retried micro-batch) re-owns its claim; two
    readers of one scope reading the same record are two owners, so only one handles it.
    Topic names cannot hold ``|``, so the token parses from the right even when the reader does.
    """
    return f"{scope}|{reader}|{topic}|{partition}|{offset}"


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


class ClaimReport(NamedTuple):
    """A batch's claim results in claim order, without a tuple per message (hot path)."""

    results: list[ClaimResult]
    lease_ms: dict[int, int]  # per BUSY claim (by index): the other owner's lease left

    def outcomes(self, claims: Sequence[Claim]) -> list[ClaimOutcome]:
        return [ClaimOutcome(claim, result, self.lease_ms.get(i, 0))
                for i, (claim, result) in enumerate(zip(claims, self.results, strict=True))]


class DoneReport(NamedTuple):
    """A batch's done results in claim order, without a tuple per message (hot path)."""

    results: list[DoneResult]
    details: dict[int, str]  # per EFFECT_ERROR / PARTIAL (by index): why effects failed

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
