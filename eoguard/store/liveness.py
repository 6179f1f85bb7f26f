"""Liveness leases: per role, a sorted set of instance id -> lease deadline (Redis time).

A producer renews its lease every ``lease_s / 3``; once the deadline passes, the records it
owns may be claimed for resend by another producer. The number of live leases is one input
of the adaptive delay. Consumers renew theirs the same way, for ``eoguard status``.
Deadlines come from Redis's clock (``TIME`` in the scripts), so instances on machines with
skewed clocks agree on who is live.
"""

from __future__ import annotations

from typing import Any, Literal

import redis

from eoguard.store.bindings.liveness import Heartbeat, LiveHeartbeat, LiveRead, LiveSet
from eoguard.store.client import RedisClient, wrap_redis_error
from eoguard.store.keys import KeySpace
from eoguard.store.scripts import Prepared, Scripts

__all__ = ["Heartbeat", "LiveSet", "Liveness"]


class Liveness:
    """Liveness leases of the producers (or the consumers) of one :class:`KeySpace`."""

    def __init__(self, client: RedisClient, keys: KeySpace, *,
                 scripts: Scripts | None = None,
                 role: Literal["producers", "consumers"] = "producers") -> None:
        self.client = client
        # role="consumers" reads/writes the consumers' lease set (``eoguard status`` shows both).
        self.key = keys.live_producers() if role == "producers" else keys.live_consumers()
        self.scripts = scripts or Scripts(client)

    def heartbeat(self, instance_id: str, lease_ms: int) -> Heartbeat:
        """Register or renew ``instance_id`` until now + ``lease_ms``; drop lapsed leases."""
        prepared = self.prepare_heartbeat(instance_id, lease_ms)
        return prepared.parse(self.scripts.run(prepared.calls, doing="renewing a liveness lease"))

    def prepare_heartbeat(self, instance_id: str, lease_ms: int) -> Prepared[Heartbeat]:
        """The call of :meth:`heartbeat`, to send along with others in one round trip."""
        def parse(replies: list[Any]) -> Heartbeat:
            return LiveHeartbeat.parse(replies[0])

        return Prepared([LiveHeartbeat.build(live_set=self.key, instance_id=instance_id,
                                             lease_ms=lease_ms)], parse)

    def live(self) -> LiveSet:
        """The instances whose lease has not lapsed, with the Redis time of the read."""
        return LiveRead.parse(self.scripts.run_one(LiveRead.build(live_set=self.key)))

    def live_count(self) -> int:
        """How many producers hold a live lease."""
        return len(self.live().deadlines)

    def is_lapsed(self, instance_id: str) -> bool:
        """True when ``instance_id`` holds no live lease (it lapsed, or never registered)."""
        return not self.live().is_live(instance_id)

    def deregister(self, instance_id: str) -> None:
        """Give the lease up at once (clean close): its records become claimable now."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(self.key, instance_id)
            pipe.execute()
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "removing a liveness lease") from exc
