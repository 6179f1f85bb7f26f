"""What a claim's outcome means for the pass that claimed: the one policy the GuardedConsumer
and the Spark job share (docs/design.md §4 for the outcomes, §6 and §7 for the two runtimes).

The claim script answers each claim with a :class:`~eoguard.store.dedup_types.ClaimResult`; a
pass turns it into a :class:`Verdict` with its :class:`ClaimPolicy`, :data:`CONSUMER` or
:func:`spark_policy`, and does what the verdict says in its own terms (a consumer counts and
dead-letters, the Spark job sets a row's status). A claim another pass holds under a live
lease (BUSY) is claimed again within one bound, :class:`BusyWait`, by both.

The Spark-only rules, where the job's policy differs from the consumer's:

- A micro-batch's token is the same for every attempt of it, so a claim can find the token
  done already (STALE) or its position given up by another attempt (PASSED); a consumer's
  token is fresh, so for a consumer either is a broken invariant (:attr:`Verdict.REFUSED`).
- The settling pass over BUSY rows gives up those still BUSY when its wait ends
  (``give_up_busy``, :meth:`ClaimPolicy.gives_up`), so every attempt of the task leaves them
  out; the first pass waits on nothing and gives nothing up, and a consumer never gives a
  claim up: it skips it.
- A replay of a batch whose done mark landed before (:func:`spark_policy` with ``replay``)
  writes what the first run wrote: its DONE_HERE rows are handled (written again), a NEW
  claim is a row the first run did not take (released, left out), and BUSY rows are not
  waited on.
- DONE_HERE outside a replay was done by another pass of the same reader (another query
  under its reader name): a duplicate; PARTIAL is done for every reader, as the job applies
  no effects of its own.

Pure logic over the store's result codes, beside them in the store layer: the consumer and
the Spark job (which may import the store, never the consumer) both call it, and nothing in
the store imports either.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eoguard.store.dedup_types import ClaimResult

__all__ = ["CONSUMER", "BusyWait", "ClaimPolicy", "Verdict", "spark_policy"]


class Verdict(enum.Enum):
    """What a pass does with one claimed message (for the Spark job: one row)."""

    HANDLE = "handle"  # the pass holds the claim: handled (a Spark row: written to the sinks)
    WAIT = "wait"  # another pass holds it under a live lease: claimed again within the bound
    DUPLICATE = "duplicate"  # done elsewhere, or a copy a pass of this runtime holds: skipped
    REDELIVERED = "redelivered"  # done at this position by this reader before: skipped
    EXPIRED = "expired"  # past expires_at by Redis's clock: skipped (dead-lettered if asked)
    DEAD_LETTER = "dead_letter"  # effects half applied by an earlier attempt: never handled
    RELEASE = "release"  # Spark replay: a row the first run did not take: released, left out
    STALE = "stale"  # Spark: the token is done already: nothing is claimed under it
    PASSED = "passed"  # Spark: an attempt of the token gave the position up: left out (busy)
    REFUSED = "refused"  # an outcome this policy never expects: the caller raises


_H, _W, _D, _X = Verdict.HANDLE, Verdict.WAIT, Verdict.DUPLICATE, Verdict.EXPIRED
_R = ClaimResult


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    """The verdict of each claim outcome for one kind of pass, and its BUSY rules."""

    name: str
    verdicts: Mapping[ClaimResult, Verdict]
    waits_on_busy: bool  # BUSY claims are waited on (no: a Spark replay leaves them out)
    gives_up_busy: bool  # a settling pass gives up what is still BUSY when its wait ends

    def verdict(self, result: ClaimResult, *, own_holder: bool = False) -> Verdict:
        """The verdict of ``result``; ``own_holder``: a BUSY claim's holder is a pass of this
        runtime (a consumer's own pass, read ahead or earlier in the batch; a copy the Spark
        task or micro-batch won), which handles it or releases it: a duplicate here, since
        waiting would wait on ourselves."""
        if own_holder and result is _R.BUSY:
            return Verdict.DUPLICATE
        return self.verdicts[result]

    def gives_up(self, settling: bool, wait: BusyWait) -> bool:
        """Whether the next claim of BUSY rows gives them up for good under the token: the
        settling pass's claim once its wait is over (Spark only)."""
        return self.gives_up_busy and settling and wait.over()


CONSUMER = ClaimPolicy("consumer", {
    _R.NEW: _H, _R.MINE: _H,
    _R.DONE_HERE: Verdict.REDELIVERED,  # its batch was done and the commit lost: read again
    _R.DUPLICATE: _D, _R.BUSY: _W, _R.EXPIRED: _X,
    _R.PARTIAL: Verdict.DEAD_LETTER,  # our own PARTIAL, re-read before its dead letter
    _R.STALE: Verdict.REFUSED, _R.PASSED: Verdict.REFUSED,  # a consumer's token is fresh
}, waits_on_busy=True, gives_up_busy=False)
"""The GuardedConsumer's policy (docs/design.md §6)."""

_SPARK = ClaimPolicy("spark", {
    _R.NEW: _H, _R.MINE: _H,
    _R.DONE_HERE: _D,  # done by another pass of this reader (another query under its name)
    _R.DUPLICATE: _D, _R.BUSY: _W, _R.EXPIRED: _X,
    _R.PARTIAL: _D,  # done by a reader whose effects half applied: done for every reader
    _R.STALE: Verdict.STALE, _R.PASSED: Verdict.PASSED,
}, waits_on_busy=True, gives_up_busy=True)

_SPARK_REPLAY = ClaimPolicy("spark replay", {
    **_SPARK.verdicts,
    _R.NEW: Verdict.RELEASE,  # the first run did not take it: not this batch's row
    _R.DONE_HERE: _H,  # the first run handled it: written again (the sinks replace)
}, waits_on_busy=False, gives_up_busy=True)  # a pass told to settle still gives up


def spark_policy(*, replay: bool) -> ClaimPolicy:
    """The Spark job's policy (docs/design.md §7); ``replay``: the micro-batch's done mark
    landed before this pass (a replay that lost its ledger entry and its Parquet commit)."""
    return _SPARK_REPLAY if replay else _SPARK


BUSY_LAPSE_MARGIN_S = 0.01
"""Claimed again this long after the earliest holder's lease was due to lapse."""


@dataclass(frozen=True, slots=True)
class BusyWait:
    """The bound on claiming BUSY messages again: until ``deadline`` (monotonic), each wait
    until the earliest holder's lease lapses or one ``step_s`` passes, whichever comes first
    (a holder may mark its claim done, or release it, at any time)."""

    deadline: float

    @classmethod
    def starting_now(cls, wait_s: float) -> BusyWait:
        return cls(time.monotonic() + wait_s)

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def next_s(self, step_s: float, lease_left_ms: Sequence[int]) -> float:
        """How long to wait before claiming again (0 once the deadline has passed)."""
        until_lapse_s = min(lease_left_ms) / 1000 + BUSY_LAPSE_MARGIN_S
        return min(step_s, until_lapse_s, max(0.0, self.deadline - time.monotonic()))
