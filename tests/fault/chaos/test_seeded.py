"""Seeded fault schedules on both topologies, then every invariant of docs/design.md §10.

A seed picks the faults and their times (schedule.py); the workload (workload.py) runs
producers in both modes and consumers in two scopes through the fault window, then drains;
the checker (checker.py) reads what happened. Each run prints one summary line (appended to
``EOGUARD_CHAOS_LOG`` too when set) and, on a violation, fails with the command replaying it.

CI (``make test``): seeds 1 and 2 on each topology with a 40 s fault window. Full mode::

    EOGUARD_CHAOS_SEEDS=15 make test PYTEST_ARGS="-m chaos"      # seeds 1..15 x 2 topologies

``EOGUARD_CHAOS_SEEDS`` is a count (seeds 1..N) or a comma list; ``EOGUARD_CHAOS_SEED`` runs
one seed alone; ``EOGUARD_CHAOS_WINDOW_S`` sets the window (full mode: 120 s);
``EOGUARD_CHAOS_NET`` (kinds, comma-separated) strikes these network, clock or split-brain
faults instead of the ones the seed draws (partition.py, clock.py, split_brain.py: one case,
replayed); ``EOGUARD_CHAOS_SPARK`` (seeds, or ``all``) adds the Spark job to single-node runs
after the drain (its driver SIGKILLed once).
A full-mode single-node seed that draws ``spark-speculation`` runs the Spark job through the
window instead, speculating, beside a consumer of its scope (spark_speculation.py); a
cluster seed may draw ``redis-reshard`` (reshard.py), and CI's cluster seed 1 does.
"""

from __future__ import annotations

import os
import random
import shlex
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.demo import observe
from eoguard.envelope import now_ms
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack import LocalStack
from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.kafka_cluster import KafkaCluster
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace
from tests.fault.chaos import checker
from tests.fault.chaos.clock import draw_skew_s
from tests.fault.chaos.faults import Cluster, FaultFn, SingleNode
from tests.fault.chaos.netcut import NetCuts, clean_leftovers
from tests.fault.chaos.partition import Partitions
from tests.fault.chaos.reshard import run_slots
from tests.fault.chaos.schedule import FULL_WINDOW_S, NET_FAULTS, schedule
from tests.fault.chaos.spark_scope import SparkScope
from tests.fault.chaos.spark_speculation import SCOPE as SPARK_SCOPE
from tests.fault.chaos.spark_speculation import SpeculatingSpark
from tests.fault.chaos.workload import (
    GRACE_S,
    LONG_TTL_S,
    MESSAGE_TIMEOUT_MS,
    RESEND_AFTER_S,
    SCOPES,
    Run,
    Workload,
)

DRAIN_S = 120.0
EXTRA_SEND_S = {"redis-reshard": 60.0}
CI_RESHARD_WEIGHT = 0.25  # CI's fourth master takes ~8% of the slots, not a quarter: ~1 min less


def _seeds() -> list[int]:
    one = os.environ.get("EOGUARD_CHAOS_SEED")
    if one:
        return [int(one)]
    many = os.environ.get("EOGUARD_CHAOS_SEEDS", "2")
    if "," in many:
        return [int(s) for s in many.split(",") if s.strip()]
    return list(range(1, int(many) + 1))


def _window_s() -> float:
    full = "EOGUARD_CHAOS_SEEDS" in os.environ or "EOGUARD_CHAOS_SEED" in os.environ
    return float(os.environ.get("EOGUARD_CHAOS_WINDOW_S", f"{FULL_WINDOW_S:g}" if full else "40"))


def _timeout_s() -> float:
    """pytest-timeout's limit for one run: CI's runs keep the suite's 600 s; a full-mode run
    waits for every message to expire (180 s TTL), and may reshard or run Spark for minutes."""
    return 600.0 if _window_s() < FULL_WINDOW_S else 3600.0


pytestmark = [pytest.mark.chaos, pytest.mark.fault, pytest.mark.integration,
              pytest.mark.timeout(_timeout_s())]


def _with_spark(seed: int, topology: str) -> bool:
    """The Spark job joins as a third scope where ``EOGUARD_CHAOS_SPARK`` lists the seed
    (``all``: every single-node run); it is slow on two cores, so some runs only."""
    wanted = os.environ.get("EOGUARD_CHAOS_SPARK", "")
    return topology == "single" and (wanted == "all" or str(seed) in wanted.split(","))


def _net() -> tuple[str, ...]:
    return tuple(k for k in os.environ.get("EOGUARD_CHAOS_NET", "").split(",") if k)


def _replay(seed: int, topology: str, window_s: float) -> str:
    net = f"EOGUARD_CHAOS_NET={','.join(_net())} " if _net() else ""
    return (f"{net}EOGUARD_CHAOS_SEED={seed} EOGUARD_CHAOS_WINDOW_S={window_s:g} make test "
            f"PYTEST_ARGS={shlex.quote(f'-m chaos -k {topology}')}")


@pytest.mark.parametrize("seed", _seeds())
@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_seeded_schedule_keeps_section_10(seed: int, topology: str, request: pytest.FixtureRequest,
                                          tmp_path: Path) -> None:
    window_s = _window_s()
    plan = schedule(seed, topology, window_s, _net())
    started = time.monotonic()
    if topology == "single":
        kafka: KafkaBroker = request.getfixturevalue("private_kafka")
        redis_server: RedisServer = request.getfixturevalue("private_redis")
        run = Run(kafka.address, redis_server.address, "local", tmp_path)
        services: SingleNode | Cluster = SingleNode(kafka, redis_server)
        ports = {"redis_ports": [redis_server.port], "kafka_ports": [kafka.port]}
    else:
        ends = request.getfixturevalue("cluster_stack")
        stack = LocalStack(topology="cluster")
        if not (ends.kafka_managed and ends.redis_managed):
            pytest.fail("the chaos runs kill cluster members: run them on a cluster this stack "
                        "manages (unset EOGUARD_CLUSTER_KAFKA_BOOTSTRAP / _REDIS_URL)")
        assert isinstance(stack.kafka, KafkaCluster)
        assert isinstance(stack.redis, RedisClusterNodes)
        run = Run(ends.kafka_bootstrap, ends.redis_url, "replicated", tmp_path)
        services = Cluster(stack.kafka, stack.redis, run.topic, run.redis_url,
                           run_slots(run.keys, SCOPES),
                           reshard_weight=1.0 if window_s >= FULL_WINDOW_S else CI_RESHARD_WEIGHT)
        services.healthy()
        ports = {"redis_ports": [n.port for n in [*stack.redis.servers, *stack.redis.added_nodes()]],
                 "kafka_ports": [n.port for n in services.brokers()]}
    keys = run.keys
    # The producers send through a full-mode resharding (a minute and more on two cores), so the
    # faults it delays still find them sending.
    send_s = window_s + sum(EXTRA_SEND_S.get(f.kind, 0.0) for f in plan
                            if window_s >= FULL_WINDOW_S)
    cuts = _net_cuts(request, run) if any(f.kind in NET_FAULTS for f in plan) else None
    work = Workload(run, send_s, cuts)
    if cuts is not None:
        services.faults.update(Partitions(work, cuts, **ports).faults)
    speculating: SpeculatingSpark | None = None
    if any(f.kind == "spark-speculation" for f in plan):
        speculating = SpeculatingSpark(run, random.Random(f"{seed}/spark-speculation"))
        services.faults["spark-speculation"] = _speculation_fault(work, speculating)
    done: list[str] = []
    try:
        if speculating is not None:  # the job reads the injected records before the window
            work.create()
            speculating.start()
            print(f"  spark: the job's first micro-batch after {speculating.wait_for_a_batch():.0f} s",
                  flush=True)
        work.start()
        opened = time.monotonic()
        for fault in plan:
            while time.monotonic() - opened < fault.at_s:
                work.check_alive()
                time.sleep(0.2)
            at = time.monotonic() - opened
            note = _strike(fault.kind, fault.hold_s, seed, work, services)
            done.append(f"{fault.kind}@{at:.0f}s")
            print(f"  {at:6.1f} s {fault.kind}: {note}", flush=True)
            services.healthy()
            work.check_alive()
        struck = len(done)
        handled_all = _drain(work, run, keys)
        drained_ms = now_ms()
        client = connect(run.redis_url)
        dead = observe.dead_letters(run.kafka, run.dead_letter_topic, run.topic)
        counts = checker.count(client, keys, work.ledgers(), work.injected, dead, drained_ms,
                               work.skews)
        ledgers = work.ledgers()
        if speculating is not None:
            print(f"  spark: {speculating.finish()}", flush=True)
            _drain_shared_scope(work, keys, speculating)
            checker.spark(counts, ledgers, work.injected, speculating.output(),
                          speculating.ended_ms,
                          consumer=Counter(observe.effect_counts(client, keys, SPARK_SCOPE)))
            counts.spark.update(speculating.counts)
        elif _with_spark(seed, topology):
            job = SparkScope(run)
            note = job.run_with_a_kill(random.Random(f"{seed}/spark"))
            done.append(f"spark-driver-kill@{time.monotonic() - opened:.0f}s")
            print(f"  spark: {note}", flush=True)
            checker.spark(counts, ledgers, work.injected, job.output(), job.ended_ms)
        last_expiry = max(e for lv in ledgers for e in lv.expires_ms.values())
        violations = counts.violations() + services.violations
        if speculating is not None:
            violations += speculating.violations
        lifetimes = checker.key_lifetimes(client, keys, ledgers, work.skews, int(GRACE_S * 1000))
        print(f"  {lifetimes.line()}", flush=True)
        violations += lifetimes.violations
        if window_s >= FULL_WINDOW_S:  # full mode: every message of the run expired plus grace
            time.sleep(max(0.0, (last_expiry + GRACE_S * 1000 - now_ms()) / 1000 + 1.0))
            violations += checker.leftovers(client, keys)
        else:  # CI: those expired plus grace by now (the rest: their TTLs checked above)
            gone_by = now_ms() - int(GRACE_S * 1000) - 1000
            violations += checker.leftovers(client, keys, {
                m for lv in ledgers for m, e in lv.expires_ms.items() if e <= gone_by})
        violations += [f"worker {name} crashed (see {tmp_path}/{name}.log)" for name in work.crashed]
        client.close()
    finally:
        if speculating is not None:
            speculating.stop()
        work.stop()
        services.healthy()  # the next test (or session) finds the topology whole
    line = (f"chaos seed={seed} topology={topology} window={window_s:g}s drained={handled_all} "
            f"{counts.line()} violations={len(violations)} faults={','.join(done)} "
            f"took={time.monotonic() - started:.0f}s")
    print(line)
    log = os.environ.get("EOGUARD_CHAOS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")
            f.write(f"    {lifetimes.line()}\n")
            for v in violations:
                f.write(f"    {v}\n")
    assert struck == len(plan)
    assert counts.guaranteed > 0.5 * len(work.slots) * work.count, "too few messages guaranteed"
    assert not violations, (f"seed {seed} on {topology} broke §10:\n  " + "\n  ".join(violations)
                            + f"\nreplay: {_replay(seed, topology, window_s)}")


def _net_cuts(request: pytest.FixtureRequest, run: Run) -> NetCuts:
    """The run's cgroups and nftables table, removed when the test ends however it ends
    (and those a crashed test process left, first)."""
    for name in clean_leftovers():
        print(f"  removed a crashed run's {name}", flush=True)
    cuts = NetCuts(run.run_id)
    request.addfinalizer(cuts.close)
    return cuts


def _strike(kind: str, hold_s: float, seed: int, work: Workload, services: SingleNode | Cluster
            ) -> str:
    rng = random.Random(f"{seed}/{kind}/{hold_s}")
    if kind == "producer-kill":
        return work.kill_producer(rng, hold_s, after_guarantee=False)
    if kind == "producer-kill-after-guarantee":
        return work.kill_producer(rng, hold_s, after_guarantee=True)
    if kind == "consumer-kill-mid-batch":
        return work.kill_consumer(rng, hold_s)
    if kind == "consumer-kill-mid-rebalance":
        return work.kill_in_rebalance(rng, hold_s)
    if kind == "consumer-zombie":
        return work.pause_consumer(rng, hold_s)
    if kind == "producer-clock-skew":
        return work.skew_producer(rng, hold_s, draw_skew_s(rng))
    if kind == "consumer-clock-skew":
        return work.skew_consumer(rng, hold_s, draw_skew_s(rng))
    return services.faults[kind](rng, hold_s)


def _speculation_fault(work: Workload, job: SpeculatingSpark) -> FaultFn:
    """Arms the SIGKILL of the executor of the next straggler (the other faults go on
    meanwhile). The job has the scope to itself until 30 s after the kill; then a
    GuardedConsumer joins the scope from the topic's start: it meets the job's done claims and
    the claims of the micro-batch it runs (BUSY), overtakes it, and the job meets the
    consumer's claims in turn (BUSY: waited on, then given up for good). 20 s after joining
    the consumer is paused 15 s (a zombie): its claims lapse, the job may take them over."""
    def strike(_rng: random.Random, hold_s: float) -> str:
        def then() -> str:
            time.sleep(30.0)
            name = work.join_scope(SPARK_SCOPE)
            time.sleep(20.0)
            return f"30 s later {name} joined the scope, then {work.pause_member(SPARK_SCOPE)(15.0)}"
        return job.arm_executor_kill(hold_s, when_straggling=lambda: then)
    return strike


def _unexpired_guaranteed(work: Workload) -> set[str]:
    """The ids the producers saw guaranteed that have not expired yet."""
    guaranteed: set[str] = set()
    expires: dict[str, int] = {}
    for ledger in work.ledgers():
        guaranteed |= ledger.guaranteed
        expires.update(ledger.expires_ms)
    now = now_ms()
    return {m for m in guaranteed if expires[m] > now}


def _settled(work: Workload, deadline: float, handled: Callable[[set[str]], bool]) -> bool:
    """Wait until ``handled`` holds for the guaranteed ids not expired yet (then 2 s more:
    anything in flight that would double-handle has time to show); False at ``deadline``."""
    while time.monotonic() < deadline:
        work.check_alive()
        if handled(_unexpired_guaranteed(work)):
            time.sleep(2.0)
            return True
        time.sleep(0.5)
    return False


def _drain_shared_scope(work: Workload, keys: KeySpace, job: SpeculatingSpark) -> bool:
    """After the Spark job ended: wait until the consumer sharing its scope handled every
    guaranteed unexpired message the job left out (BUSY when it read them)."""
    client = connect(work.run.redis_url)
    try:
        return _settled(work, time.monotonic() + DRAIN_S, lambda open_: open_ <= (
            observe.effect_counts(client, keys, SPARK_SCOPE).keys() | job.output().keys()))
    finally:
        client.close()


def _drain(work: Workload, run: Run, keys: KeySpace) -> bool:
    """Let the producers finish, keep one recovering producer running (as a deployment
    would), and wait until every guaranteed message is handled in each scope or expired."""
    deadline = time.monotonic() + DRAIN_S
    while not work.producers_done() and time.monotonic() < deadline:
        work.check_alive()
        time.sleep(0.5)
    recoverer = GuardedProducer(ProducerConfig(
        kafka={"bootstrap.servers": run.kafka, "message.timeout.ms": MESSAGE_TIMEOUT_MS},
        redis=RedisConfig(url=run.redis_url, durability=run.durability), keyspace=keys,
        resend_after_s=RESEND_AFTER_S, lease_s=1.0, recover_interval_s=0.5, default_ttl_s=LONG_TTL_S,
        instance_id="chaos-recoverer"))
    client = connect(run.redis_url)
    try:
        return _settled(work, deadline, lambda open_: all(
            open_ <= observe.effect_counts(client, keys, s).keys() for s in SCOPES))
    finally:
        recoverer.close()
        client.close()
