"""The chaos workload: producers in both modes, consumers in two scopes, injected records.

Workers are ``eoguard.demo.worker`` subprocesses (their ledgers and Redis-side effects are what
the checker reads). Producers send guaranteed orders at a steady pace, every tenth with a short
TTL, and produce some guaranteed envelopes a second time on purpose; each consumer scope
counts its handlings inside the done mark's transaction. A killed producer is replaced by one
that sends the rest of its orders and recovers what the dead one left in the outbox.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eoguard.demo import observe
from eoguard.demo.inject import Injected, inject
from eoguard.demo.procs import Worker, spawn
from eoguard.envelope import now_ms
from eoguard.stack import create_topics
from eoguard.store.keys import KeySpace
from tests.fault.chaos.clock import SKEW_S, Skew, faketime_env
from tests.fault.chaos.netcut import NetCuts

SCOPES = ("orders", "billing")
MODES = ("persist-first", "persist-first", "delayed")  # one producer per entry
RATE = 30.0  # orders/s per producer: the consumers (two cores, shared) keep well ahead
LONG_TTL_S = 180.0  # past the longest fault chain here: a ~60 s Kafka restart, a zombie, the backlog
MESSAGE_TIMEOUT_MS = 6_000  # librdkafka gives up on a delivery after this...
RESEND_AFTER_S = 10.0  # ...and recovery resends a record not published after this
SHORT_TTL_S = 4.0
SHORT_EVERY = 10
GRACE_S = 3.0
# The key prefix's max_ttl: minutes, so that invariant 6 (no key outlives max_ttl plus grace)
# is near every claim of the run, not a month away. The shortest that a consumer running the
# largest skew behind still accepts a fresh long-TTL order from (docs/design.md §5, Clocks: its
# input rule is that much stricter, and the allowance is capped at the 3 s grace).
MAX_TTL_S = LONG_TTL_S + SKEW_S[1]
# A producer running ahead sends its long orders with this TTL: past max_ttl by its own clock
# for every skew drawn, so its clamp to Redis's now + max_ttl (§5) decides their expiry.
AHEAD_TTL_S = MAX_TTL_S - SKEW_S[0] + 1.0
CONSUMER_LEASE_S = 3.0
PRODUCER_LEASE_S = 1.0
EXPIRED = 20
MODULE = "eoguard.demo.worker"


@dataclass
class Run:
    """The names and endpoints of one chaos run."""

    kafka: str
    redis_url: str
    durability: str
    folder: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def topic(self) -> str:
        return f"chaos-{self.run_id}"

    @property
    def dead_letter_topic(self) -> str:
        return f"chaos-{self.run_id}.dlq"

    @property
    def prefix(self) -> str:
        return f"chaos{self.run_id}"

    @property
    def keys(self) -> KeySpace:
        """The run's key prefix, laid out with the workload's short max_ttl."""
        return KeySpace(prefix=self.prefix, max_ttl_ms=int(MAX_TTL_S * 1000))


@dataclass
class Slot:
    """One producer line of orders: the live worker sending them, and its predecessors."""

    mode: str
    first: int
    count: int
    worker: Worker
    ledgers: list[observe.LedgerView] = field(default_factory=list)


class Workload:
    """Starts the workers, kills and replaces them on demand, and reads what they did."""

    def __init__(self, run: Run, window_s: float, cuts: NetCuts | None = None) -> None:
        self.run = run
        self.cuts = cuts  # with it, each worker runs in a cgroup of its own (netcut.py)
        self.count = int(RATE * window_s)
        self.workers: list[Worker] = []
        self.slots: list[Slot] = []
        self.members: dict[str, list[Worker]] = {scope: [] for scope in SCOPES}
        self.injected = Injected()
        self.crashed: list[str] = []  # workers that exited on their own with an error
        self.skews: list[Skew] = []  # workers that ran with a skewed clock (clock.py)
        self._created = False

    # --- start ---------------------------------------------------------------------------
    def create(self) -> None:
        """The topics, with the injected records (expired and malformed) at their start."""
        create_topics(self.run.kafka, {self.run.topic: 4, self.run.dead_letter_topic: 1})
        self.injected = inject(self.run.kafka, self.run.topic, expired=EXPIRED)
        self._created = True

    def start(self) -> None:
        """The workers (and the topics first, unless :meth:`create` made them)."""
        if not self._created:
            self.create()
        for scope in SCOPES:
            self.members[scope].append(self._consumer(scope, f"{scope}-0"))
        self.members[SCOPES[0]].append(self._consumer(SCOPES[0], f"{SCOPES[0]}-1"))
        for i, mode in enumerate(MODES):
            first = i * 10_000_000
            slot = Slot(mode, first, self.count, self._producer(mode, first, self.count))
            slot.ledgers.append(observe.LedgerView(self._ledger(slot.worker.name)))
            self.slots.append(slot)

    def _common(self, name: str) -> list[str]:
        return ["--bootstrap", self.run.kafka, "--redis-url", self.run.redis_url,
                "--prefix", self.run.prefix, "--max-ttl-s", f"{MAX_TTL_S:g}", "--topic", self.run.topic,
                "--durability", self.run.durability,
                "--stats", str(self.run.folder / f"{name}.json")]

    def _ledger(self, name: str) -> Path:
        return self.run.folder / f"{name}.ledger"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None) -> Worker:
        module = ["-m", MODULE] if self.cuts is None else self.cuts.argv(name, MODULE)
        worker = spawn(name, [*module, *argv], log=self.run.folder / f"{name}.log", env=env)
        self.workers.append(worker)
        return worker

    def _producer(self, mode: str, first: int, count: int, env: dict[str, str] | None = None,
                  ttl_s: float = LONG_TTL_S) -> Worker:
        name = f"p{len(self.workers)}"
        return self._spawn(name, [
            "producer", *self._common(name), "--name", name, "--ledger", str(self._ledger(name)),
            "--mode", mode, "--start", str(first), "--count", str(count), "--rate", str(RATE),
            "--ttl-s", f"{ttl_s:g}", "--short-every", str(SHORT_EVERY),
            "--short-ttl-s", str(SHORT_TTL_S), "--duplicate-every", "40",
            "--lease-s", str(PRODUCER_LEASE_S), "--recover-after-s", "3.0",
            "--message-timeout-ms", str(MESSAGE_TIMEOUT_MS), "--resend-after-s", str(RESEND_AFTER_S)],
            env)

    def _consumer(self, scope: str, instance: str, env: dict[str, str] | None = None) -> Worker:
        name = f"c{len(self.workers)}-{instance}"
        return self._spawn(name, [
            "consumer", *self._common(name), "--scope", scope, "--group", f"{self.run.topic}-{scope}",
            "--instance", instance, "--dead-letter-topic", self.run.dead_letter_topic,
            "--grace-s", str(GRACE_S), "--lease-s", str(CONSUMER_LEASE_S)], env)

    # --- faults of the workers -----------------------------------------------------------
    def kill_producer(self, rng: random.Random, hold_s: float, *, after_guarantee: bool) -> str:
        """SIGKILL a live producer (right after a guarantee it reported, or at a random
        moment: most then have sends in flight), then start its replacement."""
        live = [s for s in self.slots if s.worker.alive()]
        if not live:
            return "no producer alive"
        slot = rng.choice(live)
        ledger = slot.ledgers[-1]
        if after_guarantee:
            before = len(ledger.poll().guaranteed)
            deadline = time.monotonic() + 5.0
            while len(ledger.poll().guaranteed) == before and time.monotonic() < deadline:
                time.sleep(0.005)
        slot.worker.kill()
        ledger.poll()
        in_flight = len(set(ledger.sent) - ledger.guaranteed - set(ledger.failed))
        time.sleep(hold_s)
        self._replace(slot)
        return f"{slot.mode} producer killed with {in_flight} sends not yet guaranteed"

    def _replace(self, slot: Slot, env: dict[str, str] | None = None, ttl_s: float = LONG_TTL_S
                 ) -> None:
        """A new producer sends the orders of ``slot`` its predecessors did not reach."""
        next_seq = max((lv.poll().max_seq for lv in slot.ledgers), default=-1) + 1
        start = max(next_seq, slot.first)
        slot.worker = self._producer(slot.mode, start, slot.first + slot.count - start, env, ttl_s)
        slot.ledgers.append(observe.LedgerView(self._ledger(slot.worker.name)))

    def kill_consumer(self, rng: random.Random, hold_s: float) -> str:
        """SIGKILL a consumer while it handles (it always has records to handle), restart it."""
        scope = rng.choice(SCOPES)
        victim = rng.randrange(len(self.members[scope]))
        self.members[scope][victim].kill()
        time.sleep(hold_s)
        self._restart(scope, victim)
        return f"{scope} member {victim} killed"

    def kill_in_rebalance(self, rng: random.Random, hold_s: float) -> str:
        """A new member joins a scope's group; while the group rebalances, SIGKILL another."""
        scope = rng.choice(SCOPES)
        members = self.members[scope]
        victim = rng.randrange(len(members))
        members.append(self._consumer(scope, f"{scope}-{len(members)}"))
        time.sleep(hold_s)
        members[victim].kill()
        self._restart(scope, victim)
        return f"{scope} grew to {len(members)} members, member {victim} killed in the rebalance"

    def pause_consumer(self, rng: random.Random, hold_s: float) -> str:
        """SIGSTOP a consumer past its lease and its session (its partitions move: a zombie),
        then SIGCONT it."""
        scope = rng.choice(SCOPES)
        worker = rng.choice(self.members[scope])
        worker.proc.send_signal(signal.SIGSTOP)
        time.sleep(hold_s)
        worker.proc.send_signal(signal.SIGCONT)
        return f"{scope} member {worker.name} paused {hold_s:.0f} s"

    def join_scope(self, scope: str) -> str:
        """A consumer of one more scope (the Spark job's: it shares the scope), no worker
        fault's target; its name."""
        self.members[scope] = [self._consumer(scope, f"{scope}-0")]
        return self.members[scope][0].name

    def pause_member(self, scope: str) -> Callable[[float], str]:
        """SIGSTOP the first consumer of ``scope`` now; the function returned SIGCONTs it once
        it has been paused the seconds it is given (past its lease and session: a zombie)."""
        worker = self.members[scope][0]
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGSTOP)

        def resume(at_least_s: float) -> str:
            time.sleep(max(0.0, at_least_s - (time.monotonic() - started)))
            worker.proc.send_signal(signal.SIGCONT)
            return f"{scope} member {worker.name} paused {time.monotonic() - started:.0f} s"
        return resume

    def _restart(self, scope: str, index: int, env: dict[str, str] | None = None) -> None:
        self.members[scope][index] = self._consumer(scope, f"{scope}-{index}", env)

    def skew_producer(self, rng: random.Random, hold_s: float, skew_s: int) -> str:
        """SIGKILL a live producer, run its replacement ``skew_s`` off for ``hold_s`` (ahead:
        sending its long orders with :data:`AHEAD_TTL_S`), SIGKILL it and start one in step
        (clock.py)."""
        live = [s for s in self.slots if s.worker.alive()]
        if not live:
            return "no producer alive"
        slot = rng.choice(live)
        slot.worker.kill()
        self._replace(slot, faketime_env(skew_s, self.run.folder),
                      AHEAD_TTL_S if skew_s > 0 else LONG_TTL_S)
        skew = Skew(slot.worker.name, "producer", None, skew_s * 1000, now_ms())
        time.sleep(hold_s)
        slot.worker.kill()
        skew.to_ms, skew.ids = now_ms(), slot.ledgers[-1].poll().sent_ids
        self.skews.append(skew)
        self._replace(slot)
        return f"{slot.mode} producer {skew.worker} ran {skew_s:+d} s off for {hold_s:.0f} s"

    def skew_consumer(self, rng: random.Random, hold_s: float, skew_s: int) -> str:
        """SIGKILL a consumer, run its replacement ``skew_s`` off for ``hold_s``, SIGKILL it
        and start one in step (clock.py)."""
        scope = rng.choice(SCOPES)
        index = rng.randrange(len(self.members[scope]))
        self.members[scope][index].kill()
        self._restart(scope, index, faketime_env(skew_s, self.run.folder))
        skew = Skew(self.members[scope][index].name, "consumer", scope, skew_s * 1000, now_ms())
        time.sleep(hold_s)
        self.members[scope][index].kill()
        skew.to_ms = now_ms()
        self.skews.append(skew)
        self._restart(scope, index)
        return f"{scope} member {skew.worker} ran {skew_s:+d} s off for {hold_s:.0f} s"

    # --- reading -------------------------------------------------------------------------
    def producers_done(self) -> bool:
        return all(not s.worker.alive() for s in self.slots)

    def ledgers(self) -> list[observe.LedgerView]:
        return [lv.poll() for s in self.slots for lv in s.ledgers]

    def check_alive(self) -> None:
        """Note (once) every worker that exited on its own with an error: a crash."""
        for worker in self.workers:
            code = worker.proc.poll()
            if code not in (None, 0) and not worker.killed and worker.name not in self.crashed:
                self.crashed.append(worker.name)
        for scope, members in self.members.items():
            for i, worker in enumerate(members):
                if worker.name in self.crashed and not worker.alive():
                    self._restart(scope, i)
        for slot in self.slots:
            if slot.worker.name in self.crashed and not slot.worker.alive():
                self._replace(slot)

    def stop(self) -> None:
        for worker in self.workers:
            if worker.alive():
                os.kill(worker.proc.pid, signal.SIGCONT)
            worker.stop(15)
