"""The claim-outcome policy the consumer and the Spark job share (eoguard.store.claim_policy):
every outcome's verdict for each kind of pass, the BUSY-holder rule, the wait bound and the
give-up rule. Pure logic: the consumer (tests/unit/test_pipeline.py) and the Spark job
(tests/spark/test_claims.py, test_attempts.py) are tested through it elsewhere."""

from __future__ import annotations

import time

import pytest

from eoguard.store.claim_policy import CONSUMER, BusyWait, Verdict, spark_policy
from eoguard.store.dedup_types import ClaimResult

R, V = ClaimResult, Verdict

EXPECTED = {  # outcome: (consumer, Spark, Spark replay of a done batch)
    R.NEW: (V.HANDLE, V.HANDLE, V.RELEASE),
    R.MINE: (V.HANDLE, V.HANDLE, V.HANDLE),
    R.DONE_HERE: (V.REDELIVERED, V.DUPLICATE, V.HANDLE),
    R.DUPLICATE: (V.DUPLICATE, V.DUPLICATE, V.DUPLICATE),
    R.BUSY: (V.WAIT, V.WAIT, V.WAIT),
    R.EXPIRED: (V.EXPIRED, V.EXPIRED, V.EXPIRED),
    R.PARTIAL: (V.DEAD_LETTER, V.DUPLICATE, V.DUPLICATE),
    R.STALE: (V.REFUSED, V.STALE, V.STALE),
    R.PASSED: (V.REFUSED, V.PASSED, V.PASSED),
}


@pytest.mark.parametrize("result", list(ClaimResult))
def test_each_outcome_has_one_verdict_per_kind_of_pass(result: ClaimResult) -> None:
    policies = (CONSUMER, spark_policy(replay=False), spark_policy(replay=True))
    assert tuple(p.verdict(result) for p in policies) == EXPECTED[result]


@pytest.mark.parametrize("policy", [CONSUMER, spark_policy(replay=False),
                                    spark_policy(replay=True)])
def test_a_busy_claim_held_by_a_pass_of_our_own_is_a_duplicate(policy) -> None:
    assert policy.verdict(R.BUSY, own_holder=True) is V.DUPLICATE
    for result in ClaimResult:  # the rule is about BUSY holders only
        if result is not R.BUSY:
            assert policy.verdict(result, own_holder=True) is policy.verdict(result)


def test_only_a_spark_settling_pass_gives_up_and_only_once_its_wait_is_over() -> None:
    over, running = BusyWait(time.monotonic() - 1), BusyWait.starting_now(60)
    spark, replay = spark_policy(replay=False), spark_policy(replay=True)
    assert spark.gives_up(True, over)
    assert not spark.gives_up(True, running)
    assert not spark.gives_up(False, over)  # a first pass leaves BUSY rows to the settling one
    assert not CONSUMER.gives_up(True, over)  # a consumer never gives a claim up: it skips it
    assert spark.waits_on_busy
    assert CONSUMER.waits_on_busy
    assert not replay.waits_on_busy  # a replay leaves out what its first run did not take


def test_the_busy_wait_is_bounded_by_the_step_the_earliest_lease_and_the_deadline() -> None:
    wait = BusyWait.starting_now(60)
    assert wait.next_s(0.5, [10_000, 20_000]) == 0.5  # the step
    assert wait.next_s(5.0, [300, 20_000]) == pytest.approx(0.31)  # the lease, plus a margin
    short = BusyWait.starting_now(0.2)
    assert 0.1 < short.next_s(5.0, [10_000]) <= 0.2  # the deadline
    assert BusyWait(time.monotonic() - 1).next_s(5.0, [10_000]) == 0.0
    assert BusyWait(time.monotonic() - 1).over()
    assert not wait.over()
