"""Bindings of the liveness scripts (``lua/live_*.lua``) and the values their replies become."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from eoguard.store.bindings.layout import Binding, Contract, Fixed, Layout, Returns, Row
from eoguard.store.client import reply_text
from eoguard.store.scripts import ScriptCall

__all__ = ["Heartbeat", "LiveHeartbeat", "LiveRead", "LiveSet"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat:
    """Redis time of a renewal and the number of live leases after it."""

    now_ms: int
    live_count: int


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveSet:
    """The live instances and their lease deadlines, as read at ``read_at_ms`` (Redis time)."""

    read_at_ms: int
    deadlines: dict[str, int]

    def is_live(self, instance_id: str) -> bool:
        return instance_id in self.deadlines


class HeartbeatArgs(NamedTuple):
    """The arguments of ``live_heartbeat``."""

    instance_id: str
    lease_ms: int


class LeaseItems(NamedTuple):
    """What ``deadlines`` lists per live lease (read inline by :meth:`LiveRead.parse`)."""

    id: bytes
    deadline_ms: bytes


_LIVE_SET = Layout(Fixed(("live_set",)))


class LiveHeartbeat(Binding):
    """``live_heartbeat``: renew one instance's lease, drop lapsed ones."""

    contract = Contract(
        "live_heartbeat", keys=_LIVE_SET, argv=Layout(Fixed(HeartbeatArgs._fields)),
        returns=Returns(tuple(f.name for f in fields(Heartbeat))))

    @classmethod
    def build(cls, *, live_set: str, instance_id: str, lease_ms: int) -> ScriptCall:
        return cls.call([live_set], [*HeartbeatArgs(instance_id, lease_ms)])

    @staticmethod
    def parse(reply: Any) -> Heartbeat:
        return Heartbeat(now_ms=int(reply[0]), live_count=int(reply[1]))


class LiveRead(Binding):
    """``live_read``: the live instances, by Redis's clock."""

    contract = Contract(
        "live_read", keys=_LIVE_SET, argv=Layout(),
        returns=Returns(tuple(f.name for f in fields(LiveSet)), rest=True,
                        rows=(Row("lease", LeaseItems._fields),)))

    @classmethod
    def build(cls, *, live_set: str) -> ScriptCall:
        return cls.call([live_set], [])

    @staticmethod
    def parse(reply: Any) -> LiveSet:
        items = reply[1:]  # LeaseItems: id, deadline_ms
        return LiveSet(read_at_ms=int(reply[0]),
                       deadlines={reply_text(items[i]): int(float(items[i + 1]))
                                  for i in range(0, len(items), 2)})
