"""``eoguard-dev demo``: the guarantee shown end to end on the local stack, crashes included.

Step 1. Start the stack if needed; create the run's topic and dead-letter topic.
Step 2. Start consumer c1 (scope ``orders``) and producer p1 (subprocesses, see worker.py).
Step 3. While p1 sends: inject expired envelopes and malformed records straight to the topic;
        SIGKILL c1 mid-way and start c2 (it takes over c1's partitions and claims); SIGKILL p1
        (persist-first) mid-way and start p2 (delayed mode), which sends the rest and recovers
        what p1 left in the outbox; its adaptive delay and the Redis writes it avoided are
        sampled over the run for the report's chart.
Step 4. Once the producers are done: the Spark job (scope ``orders-spark``) reads the topic.
Step 5. Wait until c2 committed the whole topic and handled every guaranteed message (or the
        timeout); stop c2 and the Spark job.
Step 6. Compare the ledgers with the handlers' committed effects in Redis, the dead-letter
        topic and the Spark output; the report says which invariant, if any, broke.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import redis

from eoguard.demo import observe
from eoguard.demo.inject import Injected, inject
from eoguard.demo.plan import ORDER_SCHEMA, DemoOptions, RunDir, RunNames, spark_available
from eoguard.demo.procs import Worker, spawn
from eoguard.demo.report import DemoReport, check, delayed_run, scope_result
from eoguard.errors import BrokerError, DemoError
from eoguard.stack import Endpoints, LocalStack, create_topics
from eoguard.stack.paths import repo_root
from eoguard.store.client import connect
from eoguard.store.keys import KeySpace

PRODUCER_LEASE_S = 1.0
Progress = Callable[[str, int, int | None], None]  # (task, completed, total)
Event = Callable[[str], None]


@dataclass
class Demo:
    """One run; ``progress`` and ``event`` feed the display (no-ops by default)."""

    options: DemoOptions
    progress: Progress = lambda task, done, total: None
    event: Event = lambda text: None
    workers: dict[str, Worker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names = RunNames.of(self.options.run_id)
        self.run_dir = RunDir(self.options.run_id)
        self.keys = KeySpace(prefix=self.names.prefix)
        self.report = DemoReport(run_id=self.options.run_id, topic=self.names.topic,
                                 prefix=self.names.prefix, messages=self.options.messages)

    # Processes -----------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], *, cwd: Path | None = None) -> Worker:
        worker = spawn(name, argv, log=self.run_dir.log(name), cwd=cwd)
        self.workers[name] = worker
        return worker

    def _common(self, ends: Endpoints, worker: str) -> list[str]:
        return ["--bootstrap", ends.kafka_bootstrap, "--redis-url", ends.redis_url,
                "--prefix", self.names.prefix, "--topic", self.names.topic,
                "--stats", str(self.run_dir.stats(worker))]

    def _producer(self, ends: Endpoints, name: str, start: int, count: int, mode: str) -> Worker:
        o = self.options
        return self._spawn(name, ["-m", "eoguard.demo.worker", "producer", *self._common(ends, name),
                                  "--name", name, "--mode", mode,
                                  "--ledger", str(self.run_dir.ledger(name)),
                                  "--start", str(start), "--count", str(count),
                                  "--rate", str(o.send_rate), "--ttl-s", str(o.ttl_s),
                                  "--duplicate-every", str(o.duplicate_every),
                                  "--lease-s", str(PRODUCER_LEASE_S),
                                  "--recover-after-s", str(3 * PRODUCER_LEASE_S)])

    def _consumer(self, ends: Endpoints, name: str) -> Worker:
        n = self.names
        # c1 stops at its kill point and waits there for the SIGKILL (_maybe_kill_consumer).
        pause = ["--pause-after", str(self._consumer_kill_point())] if name == "c1" else []
        return self._spawn(name, ["-m", "eoguard.demo.worker", "consumer", *self._common(ends, name),
                                  "--scope", n.scope, "--group", n.group,
                                  "--instance", f"{n.group}-member",
                                  "--dead-letter-topic", n.dead_letter_topic, *pause])

    def _consumer_kill_point(self) -> int:
        """How many handled messages c1 is SIGKILLed at (at least one)."""
        return max(1, int(self.options.messages * self.options.kill_consumer_at))

    def _spark(self, ends: Endpoints) -> Worker:
        spark = self.run_dir.spark
        return self._spawn("spark", [
            "-m", "eoguard_spark", "--bootstrap", ends.kafka_bootstrap,
            "--topic", self.names.topic, "--scope", self.names.spark_scope,
            "--checkpoint", str(spark / "checkpoint"), "--output", str(spark / "out"),
            "--dead-letter", str(spark / "dead-letter"), "--redis-url", ends.redis_url,
            "--key-prefix", self.names.prefix, "--available-now", "--payload-schema", ORDER_SCHEMA,
            "--master", "local[2]", "--lease-s", "60", "--busy-wait-s", "20"], cwd=repo_root())

    def _create_topics(self, bootstrap: str) -> None:
        try:
            create_topics(bootstrap, {self.names.topic: self.options.partitions,
                                      self.names.dead_letter_topic: 1})
        except BrokerError as exc:
            raise DemoError(str(exc)) from exc

    # The run ---------------------------------------------------------------------------
    def run(self) -> DemoReport:
        started = time.monotonic()
        try:
            self._run(started)
        finally:
            for worker in self.workers.values():
                worker.stop(10.0)
        self.report.elapsed_s = round(time.monotonic() - started, 1)
        return self.report

    def _run(self, started: float) -> None:
        o, n, report = self.options, self.names, self.report
        deadline = started + o.timeout_s
        # Step 1.
        ends, up = LocalStack(topology=o.topology).up()
        if up:
            self.event(f"started the local stack: {', '.join(up)}")
        self.run_dir.create()
        self._create_topics(ends.kafka_bootstrap)
        client = cast("redis.Redis", connect(ends.redis_url))  # or a RedisCluster
        self.event(f"topic {n.topic} ({o.partitions} partitions), Redis prefix {n.prefix}")
        # Steps 2 and 3.
        ledgers, injected = self._produce(ends, client, deadline)
        if "p2" not in self.workers:
            report.failures.append("producer p1 finished before it could be killed "
                                   "(raise --messages or lower --rate)")
        if injected is None:
            injected = inject(ends.kafka_bootstrap, n.topic, expired=o.expired_count)
        # Step 4.
        spark_on, why = spark_available() if o.spark else (False, "off (--no-spark)")
        report.spark = "running" if spark_on else why
        if spark_on:
            self._spark(ends)
            self.event("Spark job started on the same topic in scope "
                       f"{n.spark_scope!r} (available-now trigger)")
        # Step 5.
        for view in ledgers:
            view.poll()
        guaranteed_ids = set().union(*(v.guaranteed for v in ledgers))
        self._wait_consumer(ends, client, guaranteed_ids, deadline)
        if "c2" not in self.workers:
            report.failures.append("consumer c1 was never killed (raise --messages)")
        self.workers.get("c2", self.workers["c1"]).stop(15.0)
        if spark_on:
            self._wait_spark(deadline)
        # Step 6.
        self._conclude(ends, client, ledgers=ledgers, guaranteed=guaranteed_ids, injected=injected,
                       spark_on=spark_on)

    def _produce(self, ends: Endpoints, client: redis.Redis, deadline: float
                 ) -> tuple[list[observe.LedgerView], Injected | None]:
        """Steps 2 and 3: run the producers (killing p1) while c1/c2 consume.

        The injection runs on a thread of its own: a Kafka producer's start and flush can take
        seconds on a loaded machine, and the loop must not miss p1's kill point meanwhile.
        """
        o = self.options
        self._consumer(ends, "c1")
        p1 = self._producer(ends, "p1", 0, o.messages, "persist-first")
        ledgers = [observe.LedgerView(self.run_dir.ledger("p1"))]
        injecting: Future[Injected] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-inject") as pool:
            producers_done = False
            while not producers_done and time.monotonic() < deadline:
                time.sleep(0.1)
                guaranteed = sum(len(v.poll().guaranteed) for v in ledgers)
                if p1.alive() and not p1.killed and ledgers[0].next_seq >= o.messages * o.kill_producer_at:
                    self._kill_p1(ends, p1, ledgers, guaranteed)
                handled = observe.handled_total(client, self.keys, self.names.scope)
                self.progress("guaranteed", guaranteed, o.messages)
                self.progress("handled", handled, o.messages)
                if injecting is None and guaranteed >= o.messages * 0.2:
                    injecting = pool.submit(inject, ends.kafka_bootstrap, self.names.topic,
                                            expired=o.expired_count)
                    injecting.add_done_callback(self._injected)
                self._maybe_kill_consumer(ends, handled)
                producers_done = all(not self.workers[p].alive() for p in ("p1", "p2")
                                     if p in self.workers)
                self._check_workers()
        return ledgers, (injecting.result() if injecting is not None else None)

    def _injected(self, done: Future[Injected]) -> None:
        if done.exception() is None:
            injected = done.result()
            self.event(f"wrote {len(injected.expired_ids)} expired envelopes and "
                       f"{len(injected.malformed)} malformed records straight to the topic")

    def _kill_p1(self, ends: Endpoints, p1: Worker, ledgers: list[observe.LedgerView],
                 guaranteed: int) -> None:
        """SIGKILL p1 once it has sent its share (some of it unguaranteed); p2 sends the rest."""
        p1.kill()
        self.report.producer_killed_after = guaranteed
        rest = ledgers[0].poll().next_seq
        self.event(f"SIGKILLed producer p1 after {guaranteed:,} guaranteed; p2 sends "
                   f"orders {rest:,}.. and recovers p1's outbox records")
        self._producer(ends, "p2", rest, self.options.messages - rest, "delayed")
        ledgers.append(observe.LedgerView(self.run_dir.ledger("p2")))

    def _check_workers(self) -> None:
        for name in ("p1", "p2", "c1", "c2"):
            w = self.workers.get(name)
            if w is not None and not w.alive() and not w.killed and w.proc.returncode != 0:
                raise DemoError(f"demo worker {name} exited with code {w.proc.returncode}; "
                                f"see {self.run_dir.log(name)}")

    def _maybe_kill_consumer(self, ends: Endpoints, handled: int) -> None:
        c1 = self.workers["c1"]
        if c1.alive() and not c1.killed and handled >= self._consumer_kill_point():
            c1.kill()
            self.report.consumer_killed_after = handled
            self.event(f"SIGKILLed consumer c1 after {handled:,} handled; c2 takes over")
            self._consumer(ends, "c2")

    def _wait_consumer(self, ends: Endpoints, client: redis.Redis, guaranteed: set[str],
                       deadline: float) -> None:
        while time.monotonic() < deadline:
            handled = observe.handled_total(client, self.keys, self.names.scope)
            self.progress("handled", handled, len(guaranteed))
            self._maybe_kill_consumer(ends, handled)
            self._check_workers()
            if "c2" not in self.workers:
                time.sleep(0.1)
                continue
            if handled >= len(guaranteed) and guaranteed <= observe.effect_counts(
                    client, self.keys, self.names.scope).keys() and observe.consumer_lag(
                    ends.kafka_bootstrap, self.names.group, self.names.topic) == 0:
                return
            time.sleep(0.3)
        self.event("timed out waiting for the consumer scope to catch up")

    def _wait_spark(self, deadline: float) -> None:
        spark = self.workers["spark"]
        while spark.alive() and time.monotonic() < deadline + 30:
            self.progress("spark", 0, None)
            time.sleep(0.3)
        if spark.alive():
            spark.stop(5.0)
            self.report.failures.append("the Spark job did not finish in time")
        elif spark.proc.returncode != 0:
            self.report.failures.append(f"the Spark job exited with code {spark.proc.returncode}; "
                                        f"see {self.run_dir.log('spark')}")
        else:
            self.report.spark = "ran"

    def _conclude(self, ends: Endpoints, client: redis.Redis, *,
                  ledgers: list[observe.LedgerView], guaranteed: set[str], injected: Injected,
                  spark_on: bool) -> None:
        report, n = self.report, self.names
        report.failed = sum(len(v.failed) for v in ledgers)
        report.sent = len(set().union(*(v.sent_ids for v in ledgers)))
        report.guaranteed = len(guaranteed)
        report.duplicates_injected = sum(len(v.duplicated) for v in ledgers)
        p2 = observe.read_stats(self.run_dir.stats("p2")) or {}
        report.resent_by_recovery = int(p2.get("resent", 0))
        report.delayed = delayed_run(p2)
        report.expired_injected = len(injected.expired_ids)
        report.malformed_injected = len(injected.malformed)
        dead = observe.dead_letters(ends.kafka_bootstrap, n.dead_letter_topic, n.topic)
        report.dead_lettered = len(dead)
        report.malformed_dead_lettered = len(set(injected.malformed) & set(dead))
        stats = [observe.read_stats(self.run_dir.stats(c)) or {} for c in ("c1", "c2")]
        consumer = scope_result(scope=n.scope, engine="GuardedConsumer",
                                counts=observe.effect_counts(client, self.keys, n.scope),
                                guaranteed=guaranteed, expired_ids=injected.expired_ids,
                                late=observe.late_count(client, self.keys, n.scope))
        consumer.duplicates_dropped = sum(int(s.get("duplicates", 0)) + int(s.get("fenced", 0))
                                          + int(s.get("redelivered", 0)) for s in stats)
        consumer.expired_dropped = sum(int(s.get("expired", 0)) for s in stats)
        consumer.dead_lettered = len(dead)
        report.scopes.append(consumer)
        if spark_on:
            rows = observe.spark_output(self.run_dir.spark / "out")
            spark = scope_result(scope=n.spark_scope, engine="Spark", counts=rows,
                                 guaranteed=guaranteed, expired_ids=injected.expired_ids)
            spark.duplicates_dropped, spark.expired_dropped, spark.dead_lettered = observe.spark_batch_counts(
                self.run_dir.log("spark"))
            report.scopes.append(spark)
        check(report, injected.malformed, dead)


def run_demo(options: DemoOptions, *, progress: Progress | None = None,
             event: Event | None = None) -> DemoReport:
    """Run the demo and return its report (``report.ok`` says whether every invariant held)."""
    demo = Demo(options)
    if progress is not None:
        demo.progress = progress
    if event is not None:
        demo.event = event
    return demo.run()

