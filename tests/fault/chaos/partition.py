"""Network faults of the chaos workers: a worker cut from Redis or from Kafka, a lossy link.

Each cuts one worker (netcut.py: nftables rules on its cgroup) from one service's ports for
the fault's hold, then heals it:

- ``consumer-cut-redis`` / ``producer-cut-redis``: the worker reaches Kafka, not Redis (its
  claims, done marks, outbox writes and lease renewals time out; a consumer's lease lapses
  past 3 s and its records are taken over by the member that gets its partitions);
- ``consumer-cut-kafka`` / ``producer-cut-kafka``: the worker reaches Redis, not Kafka (a
  consumer's group session lapses past 10 s: a zombie that still holds Redis claims; a
  producer's deliveries time out past 6 s and are left to recovery);
- ``slow-link-redis`` / ``slow-link-kafka``: a share (20-50 %) of a producer's or a
  consumer's packets to and from that service dropped at random: TCP retransmits, with
  backoff, so its calls slow down by seconds, some past their timeouts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from tests.fault.chaos.faults import FaultFn
from tests.fault.chaos.netcut import NetCuts
from tests.fault.chaos.workload import SCOPES, Workload


class Partitions:
    """The network faults of one run, over its workers and the services' ports."""

    def __init__(self, work: Workload, cuts: NetCuts, *, redis_ports: Sequence[int],
                 kafka_ports: Sequence[int]) -> None:
        self.work, self.cuts = work, cuts
        self.ports = {"redis": tuple(redis_ports), "kafka": tuple(kafka_ports)}
        self.faults: dict[str, FaultFn] = {}
        for service in self.ports:
            for role in ("consumer", "producer"):
                self.faults[f"{role}-cut-{service}"] = self._cutter(role, service, 1.0)
            self.faults[f"slow-link-{service}"] = self._cutter(None, service, None)

    def _cutter(self, role: str | None, service: str, share: float | None) -> FaultFn:
        """A fault cutting a ``role`` worker (None: either) from ``service``, dropping
        ``share`` of its packets (None: a share drawn from 20-50 %)."""
        def strike(rng: random.Random, hold_s: float) -> str:
            who = role or rng.choice(("consumer", "producer"))
            worker = self._consumer(rng) if who == "consumer" else self._producer(rng)
            if worker is None:
                return f"no {who} alive"
            dropped = share if share is not None else round(rng.uniform(0.2, 0.5), 2)
            cut = self.cuts.cut(worker, self.ports[service], dropped)
            try:
                time.sleep(hold_s)
            finally:
                self.cuts.heal(cut)
            return f"{cut} ({service}) for {hold_s:.0f} s, healed"
        return strike

    def _consumer(self, rng: random.Random) -> str | None:
        scope = rng.choice(SCOPES)
        live = [w.name for w in self.work.members[scope] if w.alive()]
        return rng.choice(live) if live else None

    def _producer(self, rng: random.Random) -> str | None:
        live = [s.worker.name for s in self.work.slots if s.worker.alive()]
        return rng.choice(live) if live else None
