"""A seed's fault schedule: which faults strike a run, and when.

One ``random.Random(f"{seed}/{topology}")`` picks the faults (without repeats while the
topology's list lasts) and their times inside the fault window, so a seed replays the same
schedule on the same topology. Faults run one after another: one still holding (a broker
paused, a master waiting to be replaced, a resharding) delays the next instead of overlapping
it, since two overlapping node deaths would take a three-node quorum down.

``redis-reshard`` (cluster) moves the run's slots between masters and through a fourth one
(reshard.py) for about a minute; it strikes in the first half of the window, while the
producers still send. ``spark-speculation`` (single node) runs the Spark scope through the
whole window on a speculating standalone cluster and SIGKILLs an executor mid-task
(spark_speculation.py); it needs a full-mode window (minutes of Spark on two cores).

Network and clock faults (partition.py, clock.py) come from a stream of their own,
``f"{seed}/{topology}/net"``, one per 40 s of window (CI's 40 s window: one; a full 120 s one:
three), taken in turn from one order per topology (ten full-mode seeds draw each kind three
times or more), and join the others in time order: the faults the other stream draws stay
what they were for every seed. ``net`` names them instead (a replay of one case).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Faults of the application processes, on both topologies.
WORKER_FAULTS = ("producer-kill", "producer-kill-after-guarantee", "consumer-kill-mid-batch",
                 "consumer-kill-mid-rebalance", "consumer-zombie")
SERVICE_FAULTS = {
    "single": ("kafka-kill", "kafka-pause", "redis-kill-aof", "redis-pause", "redis-oom",
               "spark-speculation"),
    "cluster": ("kafka-leader-kill", "kafka-restart-all", "kafka-pause", "redis-master-kill",
                "redis-master-pause-failover", "redis-pause", "redis-oom", "redis-reshard"),
}
SECONDS_PER_FAULT = 14.0  # a 120 s window gets 8 or 9 faults, a 40 s one 3
NET_FAULTS = ("consumer-cut-redis", "consumer-cut-kafka", "producer-cut-redis",
              "producer-cut-kafka", "slow-link-redis", "slow-link-kafka")
CLOCK_FAULTS = ("producer-clock-skew", "consumer-clock-skew")
SPLIT_BRAIN = {"single": (), "cluster": ("redis-split-brain",)}  # split_brain.py
SECONDS_PER_NET_FAULT = 40.0
FULL_WINDOW_S = 120.0
MIN_WINDOW_S = {"spark-speculation": FULL_WINDOW_S}  # drawn only in windows this long
EARLY = {"redis-reshard": 0.5}  # strikes within this fraction of the window


@dataclass(frozen=True)
class Fault:
    """One fault: when it strikes (s after the window opens), what, and how long it holds."""

    at_s: float
    kind: str
    hold_s: float

    def __str__(self) -> str:
        return f"{self.kind}@{self.at_s:.0f}s"


def schedule(seed: int, topology: str, window_s: float, net: tuple[str, ...] = ()
             ) -> list[Fault]:
    """The faults of ``seed`` on ``topology`` within ``window_s`` seconds, in time order
    (``net``: these network faults instead of the ones the seed draws)."""
    return sorted([*_process_faults(seed, topology, window_s),
                   *_net_faults(seed, topology, window_s, net)], key=lambda f: f.at_s)


def _net_faults(seed: int, topology: str, window_s: float, net: tuple[str, ...]) -> list[Fault]:
    """Seed ``s`` takes the next ``n`` kinds of one fixed order of the topology, from place
    ``(s - 1) * n`` on, so consecutive seeds go round the list evenly."""
    order = [*NET_FAULTS, *CLOCK_FAULTS, *SPLIT_BRAIN[topology]]
    random.Random(f"{topology}/net").shuffle(order)
    n = max(1, round(window_s / SECONDS_PER_NET_FAULT))
    kinds = list(net) or [order[((seed - 1) * n + i) % len(order)] for i in range(n)]
    rng = random.Random(f"{seed}/{topology}/net")
    return [Fault(round(rng.uniform(2.0, window_s - 4.0), 1), kind,
                  round(rng.uniform(*_HOLD_S[kind]), 1)) for kind in kinds]


def _process_faults(seed: int, topology: str, window_s: float) -> list[Fault]:
    rng = random.Random(f"{seed}/{topology}")
    count = max(2, round(window_s / SECONDS_PER_FAULT))
    services = [k for k in SERVICE_FAULTS[topology] if MIN_WINDOW_S.get(k, 0.0) <= window_s]
    kinds: list[str] = []
    while len(kinds) < count:
        pool = [*WORKER_FAULTS, *services]
        rng.shuffle(pool)
        kinds.extend(pool)
    # Every run has at least one service fault and one worker fault.
    chosen = kinds[:count]
    if not set(chosen) & set(services):
        chosen[0] = rng.choice(services)
    if not set(chosen) & set(WORKER_FAULTS):
        chosen[-1] = rng.choice(WORKER_FAULTS)
    times = sorted(rng.uniform(2.0, window_s - 4.0) for _ in chosen)
    for i, kind in enumerate(chosen):  # a late early fault trades places with the first,
        if kind in EARLY and times[i] > EARLY[kind] * window_s:  # earlier still if need be
            chosen[0], chosen[i] = chosen[i], chosen[0]
            times[0] = min(times[0], EARLY[kind] * window_s)
    return [Fault(round(at, 1), kind, round(rng.uniform(*_HOLD_S[kind]), 1))
            for at, kind in zip(times, chosen, strict=True)]


# How long a fault holds before the restart or resume: (min, max) seconds.
_HOLD_S: dict[str, tuple[float, float]] = {
    "producer-kill": (0.5, 3.0),  # the replacement starts after this
    "producer-kill-after-guarantee": (0.5, 3.0),
    "consumer-kill-mid-batch": (0.2, 2.0),
    "consumer-kill-mid-rebalance": (0.3, 1.5),  # the new member joins, then this, then the kill
    "consumer-zombie": (12.0, 15.0),  # SIGSTOP past the lease (3 s) and the session (10 s)
    "kafka-kill": (0.5, 4.0),
    "kafka-leader-kill": (0.5, 4.0),
    "kafka-restart-all": (0.5, 2.0),
    "kafka-pause": (6.0, 12.0),  # past the Redis and request timeouts a client notices
    "redis-kill-aof": (0.3, 3.0),
    "redis-master-kill": (0.0, 2.0),  # after the replica took over
    "redis-master-pause-failover": (5.0, 7.0),  # past the 2 s node timeout: replaced meanwhile
    "redis-pause": (6.0, 8.0),  # past the clients' 5 s socket timeout
    "redis-oom": (4.0, 8.0),
    "redis-reshard": (3.0, 8.0),  # the fourth master's time between joining and leaving
    "spark-speculation": (0.0, 1.5),  # from the straggler's first sleep to the executor kill
    # Cut past the consumer lease (3 s), the Redis socket timeout (5 s), librdkafka's message
    # timeout (6 s), and some past the group session (10 s).
    "consumer-cut-redis": (2.0, 12.0),
    "consumer-cut-kafka": (4.0, 14.0),
    "producer-cut-redis": (2.0, 10.0),
    "producer-cut-kafka": (4.0, 10.0),
    "slow-link-redis": (4.0, 10.0),
    "slow-link-kafka": (4.0, 10.0),
    "producer-clock-skew": (6.0, 15.0),  # the skewed worker's time between two SIGKILLs
    "consumer-clock-skew": (6.0, 15.0),
    "redis-split-brain": (2.0, 8.0),  # after the replica took over, before healing
}
